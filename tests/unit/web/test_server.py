"""The HTTP server on loopback, in-process: methods, gzip, keep-alive and pipelining, slow and hostile clients,
password guesses and the connection cap."""

from __future__ import annotations

import base64
import contextlib
import gzip
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from stallwatch.config.web import WebConfig
from stallwatch.discovery.server import Launch
from stallwatch.logs.source import LogSource
from stallwatch.web.auth import BasicAuth
from stallwatch.web.exposition import SharedCollection, gzip_accepted
from stallwatch.web.http import Handler, HeadError, Response, parse_head
from stallwatch.web.routes import make_app, serve
from stallwatch.web.server import HttpServer, Limits
from support.client import request
from support.harness import poll
from support.load import cut
from support.looks import Looked, look

PIPELINED = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n" * 256


HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4))


def basic(user: bytes, password: bytes) -> str:
    return "Basic " + base64.b64encode(user + b":" + password).decode()


@contextlib.contextmanager
def serving(handler: Handler | None = None, web_config: WebConfig | None = None, **limits: float) -> Iterator[int]:
    """The real server in-process (the routes of `make_app`, or `handler`); yields its port."""
    app = handler or make_app(CollectorRegistry(), SimpleNamespace(servers=list), "/metrics",  # type: ignore[arg-type]
                              web_config)
    server = HttpServer(app, "127.0.0.1", 0, Limits(**limits))  # type: ignore[arg-type]
    server.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def get(path: str, *headers: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: x", "Connection: close", *headers, "", ""]).encode()


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@contextlib.contextmanager
def in_background(*loops: Callable[[], None]) -> Iterator[list[threading.Thread]]:
    threads = [threading.Thread(target=loop, daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    yield threads


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the server closes while it is sent
        sock.sendall(data)


def _read_all_to_close(socks: list[socket.socket], deadline: float) -> list[bytes]:
    """Every socket's bytes until the server closed it; fails at `deadline` naming how many are still open."""
    answers = {sock: b"" for sock in socks}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map():
            assert time.monotonic() < deadline, f"{len(selector.get_map())} of {len(socks)} connections still open"
            for key, _ in selector.select(0.2):
                try:
                    chunk = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except ConnectionResetError:
                    chunk = b""
                answers[key.fileobj] += chunk  # type: ignore[index]
                if not chunk:
                    selector.unregister(key.fileobj)
    return list(answers.values())


@pytest.fixture
def spied_bcrypt(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """bcrypt that counts its calls (the hashes checked) and blocks on wrong passwords until `release` is set: a slow
    hash that lasts as long as a test needs."""
    real, state = bcrypt.checkpw, SimpleNamespace(calls=[], release=threading.Event())

    def checkpw(password: bytes, digest: bytes) -> bool:
        state.calls.append(digest)
        if password != b"secret":
            state.release.wait(30)
        return real(password, digest)

    monkeypatch.setattr(bcrypt, "checkpw", checkpw)
    try:
        yield state
    finally:
        state.release.set()


def _refusals(socks: list[socket.socket]) -> list[bytes]:
    """The 429 answers already there, left unread, without waiting for the other connections."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        ready = [key.fileobj for key, _ in selector.select(0)]
    answers = [sock.recv(65536, socket.MSG_PEEK) for sock in ready]  # type: ignore[union-attr]
    return [answer for answer in answers if status(answer) == 429]


class _SlowCollector:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        time.sleep(self.delay)
        gauge = GaugeMetricFamily("demo_value", "A value.", labels=["k"])
        gauge.add_metric(["a"], 1.0)
        yield gauge
        yield GaugeMetricFamily("demo_other", "Another.", value=2.0)


def _watcher(*servers: object) -> SimpleNamespace:
    return SimpleNamespace(servers=lambda: list(servers))


@pytest.fixture
def local() -> Iterator[SimpleNamespace]:
    registry = CollectorRegistry()
    collector = _SlowCollector()
    registry.register(collector)
    odd_log = "/var/log/\udce9t\ud800.log"
    odd = Looked(look("pod-\udcff\udcfe", launch=Launch(log_sources=(LogSource(odd_log, odd_log),))))
    server, _ = serve(make_app(registry, _watcher(odd), "/metrics"), "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        yield SimpleNamespace(port=server.server_port, collector=collector)
    finally:
        server.shutdown()


def _plain_server(**limits: float) -> HttpServer:
    app = make_app(CollectorRegistry(), _watcher(), "/metrics")  # type: ignore[arg-type]
    server = HttpServer(app, "127.0.0.1", 0, Limits(**limits))  # type: ignore[arg-type]
    server.start()
    return server


def test_a_client_that_always_has_another_request_queued_does_not_keep_the_only_worker() -> None:
    """The `pipeline2.py` of docs/research/audit-2026-12-01.md #4 against one worker: without turns, the worker
    serves that connection until the client stops, and nobody else is answered."""
    stop, answered = threading.Event(), []

    # A blocking socket: a slow turn must not end the flood early; the shutdown at the end unblocks both threads.
    with serving(workers=1) as port, socket.create_connection(("127.0.0.1", port)) as flood:
        def write() -> None:
            with contextlib.suppress(OSError):
                while not stop.is_set():
                    flood.sendall(PIPELINED)

        def drain() -> None:
            with contextlib.suppress(OSError):
                while not stop.is_set() and (chunk := flood.recv(1 << 20)):
                    answered.append(len(chunk))

        with in_background(write, drain) as (writer, _):
            try:
                poll(lambda: answered, what="the flood to be served")
                assert status(exchange(port, get("/-/healthy"), timeout=10)) == 200
                assert writer.is_alive()  # answered while the flood went on, not after it
            finally:
                stop.set()
                flood.shutdown(socket.SHUT_RDWR)


def test_a_request_then_an_endless_head_is_refused_at_once_on_every_connection() -> None:
    """The `bigbuf.py` of docs/research/audit-2026-12-01.md #5: after the first request is answered, the rest is
    over the head limit without an end, so the server must refuse it then, not hold it (1 MiB each) until the header
    deadline (60 s here)."""
    payload = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * (1 << 20)
    with serving(header_timeout=60.0) as port:
        socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(20)]
        try:
            with in_background(*(lambda s=s: _send_quietly(s, payload) for s in socks)):
                answers = _read_all_to_close(socks, deadline=time.monotonic() + 15)
        finally:
            for sock in socks:
                sock.close()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 200 OK") and b"HTTP/1.1 431 " in answer, answer[:200]


def test_password_guesses_never_take_the_workers_a_cached_scrape_needs(spied_bcrypt: SimpleNamespace) -> None:
    """Four workers and six guesses from one client in flight while bcrypt is stuck on the first: it runs, the five
    others are told 429 at once (one check at a time per client and user name), and the scraper with cached
    credentials is answered. Without the bound, all four workers wait on the bcrypt lock and the scrape behind them
    until bcrypt ends."""
    config = WebConfig(users={"alice": HASH})
    with serving(web_config=config, workers=4) as port:
        good = get("/-/healthy", f"Authorization: {basic(b'alice', b'secret')}")
        assert status(exchange(port, good)) == 200  # now cached
        guesses = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(6)]
        try:
            for i, sock in enumerate(guesses):
                sock.sendall(get("/metrics", f"Authorization: {basic(b'alice', b'guess%d' % i)}"))
            poll(lambda: len(spied_bcrypt.calls) == 2, what="a guess inside bcrypt")
            assert status(exchange(port, good, timeout=5)) == 200
            poll(lambda: len(_refusals(guesses)) >= 5, what="the guesses beyond the one running refused")
            assert len(_refusals(guesses)) == 5 and all(b"Retry-After: 1" in a for a in _refusals(guesses))
            spied_bcrypt.release.set()
            answers = _read_all_to_close(guesses, time.monotonic() + 10)
            assert sorted(status(a) for a in answers) == [401] + [429] * 5
        finally:
            for sock in guesses:
                sock.close()


def test_wrong_passwords_never_push_a_cached_success_out(spied_bcrypt: SimpleNamespace) -> None:
    """Wrong passwords could evict the scraper's cached success: 100 distinct failures pushed it out of the one
    cache, and its next scrape waited for bcrypt behind the guesses (docs/research/audit-2026-12-01.md #6). After 150
    failures (from 150 addresses, each checked at once) the right password is still answered from the cache, without a
    bcrypt call."""
    spied_bcrypt.release.set()  # a real bcrypt (cost 4): only the calls are counted
    auth = BasicAuth({"alice": HASH})
    assert auth.check(basic(b"alice", b"secret"))
    for i in range(150):  # more distinct failures than the cache holds
        assert auth.check(basic(b"alice", b"wrong%d" % i), f"10.0.0.{i}") is False
    calls = len(spied_bcrypt.calls)
    assert auth.check(basic(b"alice", b"secret")) and len(spied_bcrypt.calls) == calls  # still cached


def test_an_unknown_user_costs_a_bcrypt_of_the_highest_configured_cost(spied_bcrypt: SimpleNamespace) -> None:
    """With a fixed cost-10 decoy hash, a client could tell configured users from unknown ones by how long a wrong
    password takes (docs/research/audit-2026-12-01.md #14). An unknown user's check runs bcrypt once, on a decoy of
    the highest configured cost (5 here)."""
    spied_bcrypt.release.set()
    auth = BasicAuth({"alice": bcrypt.hashpw(b"a", bcrypt.gensalt(4)), "bob": bcrypt.hashpw(b"b", bcrypt.gensalt(5))})
    assert auth.check(basic(b"mallory", b"secret")) is False
    assert [int(digest.split(b"$")[2]) for digest in spied_bcrypt.calls] == [5]


@pytest.mark.parametrize("target", ["//[", "http://[", "http://a]b/"])
def test_a_target_that_does_not_parse_is_a_400_and_logs_nothing(target: str, caplog: pytest.LogCaptureFixture) -> None:
    """A request target such as `//[` or `http://[` made URL parsing raise: a 500 and a traceback in the log for
    every request, about 1.4 MB of log a second from one unauthenticated client
    (docs/research/audit-2026-12-01.md #13). It is answered 400 `malformed request target`, and nothing is logged at
    warning or above."""
    with serving() as port:
        answer = exchange(port, get(target))
    assert status(answer) == 400 and b"malformed request target" in answer, answer
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_accept_version_prometheus_client_cannot_compare_gets_the_text_format() -> None:
    """`Accept: application/openmetrics-text; version=abc` made prometheus_client's `choose_encoder` raise TypeError:
    a 500 with a traceback in the log (docs/research/audit-2026-12-01.md #13). `/metrics` answers 200 in the text
    format instead."""
    with serving() as port:
        answer = exchange(port, get("/metrics", "Accept: application/openmetrics-text; version=abc"))
    assert status(answer) == 200 and b"Content-Type: text/plain; version=0.0.4" in answer, answer[:300]


@pytest.mark.parametrize("field", ["Accept: application/openmetrics-text; version=1.1.\rSet-Cookie: pwn=1",
                                   "X-A: a\0b", "X-A: a\x1bb"])
def test_a_control_character_in_a_field_is_a_400_and_never_echoed(field: str) -> None:
    """A bare CR in `Accept` was kept in the value and echoed into the response's `Content-Type`, where it carried a
    `Set-Cookie` header of the client's making (docs/research/audit-2026-12-01.md #13). A head with a CR, a NUL or an
    ESC inside a field is answered 400, and no `Set-Cookie` comes back."""
    with serving() as port:
        answer = exchange(port, get("/metrics", field))
    assert status(answer) == 400 and b"Set-Cookie" not in answer, answer[:300]


def test_a_user_name_that_is_not_utf8_is_refused_not_a_500() -> None:
    """A client sends basic-auth credentials whose user name is not UTF-8 (the byte 0xef), which a strict decode
    would turn into an exception and a 500. The name is decoded with surrogate escapes, matches no configured user
    and is refused 401."""
    not_utf8 = basic(b"al\xefce", b"secret")
    with serving(web_config=WebConfig(users={"alice": HASH})) as port:
        assert status(exchange(port, get("/", f"Authorization: {not_utf8}"))) == 401


def test_a_handler_error_is_logged_once_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    """A client that repeats a request on which a handler fails filled the log with a traceback per request
    (docs/research/audit-2026-12-01.md #13). Each of five such requests is answered 500, and the error is logged with
    its traceback once."""
    def handler(request: object) -> Response:
        raise RuntimeError("broken")

    with serving(handler) as port:
        answers = [exchange(port, get("/")) for _ in range(5)]
    assert [status(a) for a in answers] == [500] * 5
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and logged[0].exc_info is not None, logged


def test_head_sends_no_body_and_the_landing_page_takes_get_and_head_only(local: SimpleNamespace) -> None:
    status, headers, body = request(local.port, "/", method="HEAD")
    assert (status, body) == (200, b"") and int(headers["content-length"]) > 0
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        status, headers, _ = request(local.port, "/", method=method)
        assert status == 405 and headers["allow"] == "GET, HEAD", method


def test_landing_page_survives_names_that_are_not_utf8(local: SimpleNamespace) -> None:
    status, _, body = request(local.port, "/")
    assert status == 200
    assert "pod-\\xff\\xfe" in body.decode() and "\\ud800" in body.decode()


def test_gzip_only_when_accepted(local: SimpleNamespace) -> None:
    for accept, gzipped in (("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False),
                            ("*", True), ("*;q=0", False), ("br, gzip;q=0.5", True), ("", False)):
        status, headers, body = request(local.port, "/metrics", headers={"Accept-Encoding": accept})
        assert status == 200
        assert (headers.get("content-encoding") == "gzip") is gzipped, accept
        text = gzip.decompress(body) if gzipped else body
        assert b"demo_value" in text
    assert not gzip_accepted("identity") and gzip_accepted("GZIP;Q=1")


def test_name_filtering(local: SimpleNamespace) -> None:
    _, _, body = request(local.port, "/metrics?name[]=demo_other")
    assert b"demo_other 2.0" in body and b"demo_value" not in body
    _, _, body = request(local.port, "/metrics?name[]=demo_other&name[]=demo_value")
    assert b"demo_other" in body and b"demo_value" in body
    _, _, body = request(local.port, "/metrics?name[]=nothing_like_it")
    assert body == b""


def test_unknown_path_and_malformed_requests() -> None:
    assert parse_head(b"GET /x?y=1 HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n").headers["x-a"] == "1, 2"
    for bad, status in ((b"GET /\r\n\r\n", 400), (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
                        (b"GET / HTTP/1.1\r\n\r\n", 400), (b"GET / HTTP/1.1\r\nHost a\r\n\r\n", 400),
                        (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400)):
        with pytest.raises(HeadError) as info:
            parse_head(bad)
        assert info.value.status == status, bad


def test_scrapes_that_arrive_together_share_one_collection() -> None:
    registry = CollectorRegistry()
    collector = _SlowCollector(delay=0.5)
    registry.register(collector)
    shared = SharedCollection(registry)
    results = []
    threads = [threading.Thread(target=lambda: results.append(shared.get(5.0))) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 10 and collector.calls == 1 and len({id(r) for r in results}) == 1
    shared.get(5.0)  # a later scrape starts a new one: nothing is cached past a collection
    assert collector.calls == 2
    collector.delay = 2.0
    first = threading.Thread(target=lambda: shared.get(5.0))
    first.start()
    poll(lambda: shared._flight is not None, what="collection to start")
    with pytest.raises(TimeoutError):
        shared.get(0.2)  # bounded wait
    first.join()


def test_slow_header_client_is_cut_at_the_head_deadline_and_holds_no_worker() -> None:
    registry = CollectorRegistry()
    app = make_app(registry, _watcher(), "/metrics")  # type: ignore[arg-type]
    server = HttpServer(app, "127.0.0.1", 0, Limits(workers=1, header_timeout=1.0))
    server.start()
    try:
        slow = socket.create_connection(("127.0.0.1", server.server_port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        # one worker only: the trickling client must not take it
        assert request(server.server_port)[0] == 200
        slow.settimeout(0.2)
        closed = False
        while not closed and time.monotonic() - start < 10:  # a per-read timeout would trickle on all along
            try:
                slow.sendall(b"X-A: b\r\n")  # a line every 0.2 s: a per-read timeout would never fire
                closed = slow.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed, "the head's 1 s deadline never cut a client that sends a line every 0.2 s"
        slow.close()
    finally:
        server.shutdown()


def test_pipelined_requests_and_keep_alive() -> None:
    server = _plain_server()
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as sock:
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nHEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.count(b"HTTP/1.1 200 OK") == 3 and data.count(b"Healthy.") == 2
        assert data.endswith(b"Healthy.\n") and b"Connection: close" in data
    finally:
        server.shutdown()


def test_connection_cap_closes_the_longest_waiting_for_a_new_one() -> None:
    server = _plain_server(max_connections=8)
    try:
        idle = [socket.create_connection(("127.0.0.1", server.server_port), timeout=5) for _ in range(20)]
        assert request(server.server_port)[0] == 200  # admitted: an idle one was closed for it
        poll(lambda: server.open_connections <= 8, what="cap respected")
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the oldest went first
        for sock in idle:
            sock.close()
    finally:
        server.shutdown()


def _slow_readers(port: int, count: int, data: bytes) -> list[socket.socket]:
    """Connections with a 1 KiB receive buffer that send `data` and never read, as the audit's `slowread`."""
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(data)
        socks.append(sock)
    return socks


def _writing(server: HttpServer) -> int:
    """Connections whose response the loop is still sending."""
    return sum(conn.out is not None for conn in list(server._waiting.values()))


def test_slow_readers_hold_no_worker_and_get_one_response_at_a_time() -> None:
    """16 connections that ask for a 1 MB response 50 times (pipelined) and never read held every worker in a
    blocking send for the write timeout, so `/metrics` took 8-20 s (docs/research/audit-2026-12-02.md #8). With two
    workers and a 60 s write deadline, each connection's unsent response waits in the loop, with no next request of
    it served meanwhile (what the kernel's buffers took aside), and a new client is answered at once."""
    body, made = b"x" * (1 << 20), []

    def handler(request: object) -> Response:
        made.append(1)
        return Response(200, [("Content-Type", "text/plain")], body)

    server = HttpServer(handler, "127.0.0.1", 0, Limits(workers=2, write_timeout=60.0))
    server.start()
    slow = _slow_readers(server.server_port, 16, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
    try:
        poll(lambda: _writing(server) == 16, what="16 responses left to the loop", timeout=30)
        assert status(exchange(server.server_port, get("/-/healthy"), timeout=10)) == 200
        assert _writing(server) == 16 and len(made) < 16 * 50  # the slow ones still connected, most requests unserved
    finally:
        for sock in slow:
            sock.close()
        server.shutdown()


def test_a_reader_that_stalls_is_closed_at_its_write_deadline() -> None:
    """The other half of docs/research/audit-2026-12-02.md #8: a response the loop holds for a reader that never
    reads is dropped at the response's write deadline (1 s here), with its connection, reset so that the kernel
    drops the unsent bytes too, so slow readers cannot pile up to the connection cap."""
    server = HttpServer(lambda _: Response(200, [], b"x" * (1 << 20)), "127.0.0.1", 0, Limits(write_timeout=1.0))
    server.start()
    (slow,) = _slow_readers(server.server_port, 1, b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 16)
    try:
        poll(lambda: server.open_connections == 0, what="the stalled reader closed", timeout=20)
        poll(lambda: cut(slow), what="the reset to reach the reader")  # a FIN would wait behind the unsent bytes
        assert len(read_to_close(slow)) < 16 << 20  # closed before its responses were all sent
    finally:
        slow.close()
        server.shutdown()
