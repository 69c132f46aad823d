"""stallwatch.web.http without sockets: a head found across reads and taken by offset, pipelined heads one at a time,
the head limit, keep-alive, and a response that never carries a control character in a header."""

from __future__ import annotations

import pytest

from stallwatch.web.http import HeadBuffer, HeadError, Request, Response, keep_alive, parse_head, serialize


def test_a_head_split_across_reads_is_found_once_complete() -> None:
    buffer = HeadBuffer()
    for piece in (b"GET / HTTP/1.1\r\nHost: a\r", b"\n\r", b"\n"):
        assert buffer.take_head(1000) is None  # not yet complete
        buffer.buf += piece
    assert buffer.take_head(1000) == b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
    assert buffer.pending() == 0 and buffer.take_head(1000) is None


def test_pipelined_heads_are_taken_one_at_a_time_and_compacted() -> None:
    buffer = HeadBuffer()
    one = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
    two = b"\r\nGET /b HTTP/1.1\nHost: a\n\n"  # a stray CRLF first, then bare LF lines (RFC 9112 2.2)
    buffer.buf += one + two + b"GET /c"
    assert buffer.take_head(1000) == one
    assert buffer.take_head(1000) == b"GET /b HTTP/1.1\nHost: a\n\n"
    assert buffer.take_head(1000) is None
    buffer.compact()
    assert bytes(buffer.buf) == b"GET /c" and buffer.start == 0 and buffer.pending() == 6


def test_a_head_over_the_limit_is_not_taken() -> None:
    buffer = HeadBuffer()
    buffer.buf += b"GET / HTTP/1.1\r\nHost: " + b"a" * 100 + b"\r\n\r\n"
    assert buffer.next_head(50) == -1 and buffer.take_head(50) is None
    assert buffer.take_head(1000) is not None


def test_parse_head() -> None:
    request = parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nAccept: t\r\naccept: u\r\n\r\n", "10.0.0.1")
    assert (request.method, request.path, request.query, request.peer) == ("GET", "/metrics", {"x": ["1"]}, "10.0.0.1")
    assert request.headers == {"host": "a", "accept": "t, u"}


@pytest.mark.parametrize(("head", "status"), [
    (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    (b"GET /\x1b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400),
    (b"GET //[ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
])
def test_parse_head_refuses(head: bytes, status: int) -> None:
    with pytest.raises(HeadError) as caught:
        parse_head(head)
    assert caught.value.status == status


def test_keep_alive() -> None:
    assert keep_alive(Request("GET", "/", "HTTP/1.1", {"host": "a"}))
    assert not keep_alive(Request("GET", "/", "HTTP/1.0", {}))
    assert not keep_alive(Request("GET", "/", "HTTP/1.1", {"connection": "keep-alive, Close"}))
    assert not keep_alive(Request("GET", "/", "HTTP/1.1", {"content-length": "5"}))  # its body is never read


def test_serialize() -> None:
    data = serialize(Response(200, [("Content-Type", "text/plain")], b"ok"), head_only=False, keep=False)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Length: 2" in head and head.endswith(b"close")
    assert body == b"ok"
    assert serialize(Response(200, [], b"ok"), head_only=True, keep=True).endswith(b"Content-Length: 2\r\n\r\n")
    with pytest.raises(ValueError):
        serialize(Response(200, [("X", "a\r\nSet-Cookie: b")]), head_only=False, keep=True)
