"""Basic auth: checks and the cache of good credentials."""

from __future__ import annotations

import time

import bcrypt

from stallwatch.web.auth import BasicAuth

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


def test_basic_auth_checks_and_caches() -> None:
    import base64
    auth = BasicAuth({"alice": HASH.encode()})

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert auth.check(header("alice", "secret"))
    assert not auth.check(header("alice", "wrong")) and not auth.check(header("bob", "secret"))
    assert not auth.check(None) and not auth.check("Bearer x") and not auth.check("Basic !!!")
    assert not auth.check(header("alice", "x" * 100))  # over bcrypt's 72 bytes: refused, not an exception
    start = time.perf_counter()
    for _ in range(50):
        assert auth.check(header("alice", "secret"))
    assert time.perf_counter() - start < 0.5  # cached: 50 bcrypt checks would take longer even at cost 4
