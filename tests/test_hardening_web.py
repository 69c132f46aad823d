"""Hostile HTTP clients, round two: pipelining, endless heads, password guessing and malformed requests against the
real server code on loopback. Each test reproduces one defect of `../shared/research/audit-2026-12-01.md`
(numbered as there) and fails without its fix; the speed and memory figures are `tests/bench/bench_http.py`'s."""

from __future__ import annotations

import base64
import contextlib
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

from stallwatch.config.web import WebConfig
from stallwatch.web.auth import BasicAuth
from stallwatch.web.http import Handler, Response
from stallwatch.web.routes import make_app
from stallwatch.web.server import HttpServer, Limits
from support.harness import poll

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


# --- 4. a pipelining client gets a few requests per turn of a worker, then waits behind the others -------------


def test_a_client_that_always_has_another_request_queued_does_not_keep_the_only_worker() -> None:
    """The audit's `pipeline2.py` against one worker: without turns, the worker serves that connection until the
    client stops, and nobody else is answered."""
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


# --- 5. a request followed by an endless head: refused (431) and closed at once, never buffered ----------------


def test_a_request_then_an_endless_head_is_refused_at_once_on_every_connection() -> None:
    """The audit's `bigbuf.py`: after the first request is answered, the rest is over the head limit without an end,
    so the server must refuse it then, not hold it (1 MiB each) until the header deadline (60 s here)."""
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


# --- 6. wrong passwords: never more than one bcrypt and one waiter; cached successes never wait or get evicted ----


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


def test_password_guesses_never_take_the_workers_a_cached_scrape_needs(spied_bcrypt: SimpleNamespace) -> None:
    """Four workers and six guesses in flight while bcrypt is stuck on the first: one runs, one waits, four are
    told 429 at once, and the scraper with cached credentials is answered. Without the bound, all four workers
    wait on the bcrypt lock and the scrape behind them until bcrypt ends."""
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
            poll(lambda: len(_refusals(guesses)) >= 4, what="the guesses beyond one waiting refused")
            assert len(_refusals(guesses)) == 4 and all(b"Retry-After: 1" in a for a in _refusals(guesses))
            spied_bcrypt.release.set()
            answers = _read_all_to_close(guesses, time.monotonic() + 10)
            assert sorted(status(a) for a in answers) == [401] * 2 + [429] * 4
        finally:
            for sock in guesses:
                sock.close()


def _refusals(socks: list[socket.socket]) -> list[bytes]:
    """The 429 answers already there, left unread, without waiting for the other connections."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        ready = [key.fileobj for key, _ in selector.select(0)]
    answers = [sock.recv(65536, socket.MSG_PEEK) for sock in ready]  # type: ignore[union-attr]
    return [answer for answer in answers if status(answer) == 429]


def test_wrong_passwords_never_push_a_cached_success_out(spied_bcrypt: SimpleNamespace) -> None:
    spied_bcrypt.release.set()  # a real bcrypt (cost 4): only the calls are counted
    auth = BasicAuth({"alice": HASH})
    assert auth.check(basic(b"alice", b"secret"))
    for i in range(150):  # more distinct failures than the cache holds
        assert auth.check(basic(b"alice", b"wrong%d" % i)) is False
    calls = len(spied_bcrypt.calls)
    assert auth.check(basic(b"alice", b"secret")) and len(spied_bcrypt.calls) == calls  # still cached


# --- 14. unknown users cost a bcrypt of the configured cost ------------------------------------------------------


def test_an_unknown_user_costs_a_bcrypt_of_the_highest_configured_cost(spied_bcrypt: SimpleNamespace) -> None:
    spied_bcrypt.release.set()
    auth = BasicAuth({"alice": bcrypt.hashpw(b"a", bcrypt.gensalt(4)), "bob": bcrypt.hashpw(b"b", bcrypt.gensalt(5))})
    assert auth.check(basic(b"mallory", b"secret")) is False
    assert [int(digest.split(b"$")[2]) for digest in spied_bcrypt.calls] == [5]


# --- 13. malformed targets, odd Accept versions and control characters: 4xx or a fallback, never a 500 -----------


@pytest.mark.parametrize("target", ["//[", "http://[", "http://a]b/"])
def test_a_target_that_does_not_parse_is_a_400_and_logs_nothing(target: str, caplog: pytest.LogCaptureFixture) -> None:
    with serving() as port:
        answer = exchange(port, get(target))
    assert status(answer) == 400 and b"malformed request target" in answer, answer
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_accept_version_prometheus_client_cannot_compare_gets_the_text_format() -> None:
    with serving() as port:
        answer = exchange(port, get("/metrics", "Accept: application/openmetrics-text; version=abc"))
    assert status(answer) == 200 and b"Content-Type: text/plain; version=0.0.4" in answer, answer[:300]


@pytest.mark.parametrize("field", ["Accept: application/openmetrics-text; version=1.1.\rSet-Cookie: pwn=1",
                                   "X-A: a\0b", "X-A: a\x1bb"])
def test_a_control_character_in_a_field_is_a_400_and_never_echoed(field: str) -> None:
    with serving() as port:
        answer = exchange(port, get("/metrics", field))
    assert status(answer) == 400 and b"Set-Cookie" not in answer, answer[:300]


def test_a_user_name_that_is_not_utf8_is_refused_not_a_500() -> None:
    not_utf8 = basic(b"al\xefce", b"secret")
    with serving(web_config=WebConfig(users={"alice": HASH})) as port:
        assert status(exchange(port, get("/", f"Authorization: {not_utf8}"))) == 401


def test_a_handler_error_is_logged_once_per_kind(caplog: pytest.LogCaptureFixture) -> None:
    def handler(request: object) -> Response:
        raise RuntimeError("broken")

    with serving(handler) as port:
        answers = [exchange(port, get("/")) for _ in range(5)]
    assert [status(a) for a in answers] == [500] * 5
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and logged[0].exc_info is not None, logged
