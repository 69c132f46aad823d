"""Basic auth: checks and the cache of good credentials."""

from __future__ import annotations

import base64

import bcrypt
import pytest

from stallwatch.web.auth import BasicAuth

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


def test_basic_auth_checks_and_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = BasicAuth({"alice": HASH.encode()})

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert auth.check(header("alice", "secret"))
    assert not auth.check(header("alice", "wrong")) and not auth.check(header("bob", "secret"))
    assert not auth.check(None) and not auth.check("Bearer x") and not auth.check("Basic !!!")
    assert not auth.check(header("alice", "x" * 100))  # over bcrypt's 72 bytes: refused, not an exception
    checked: list[bytes] = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, digest: checked.append(digest) or real(password, digest))
    for _ in range(50):
        assert auth.check(header("alice", "secret"))
    assert checked == []  # cached: no bcrypt check for credentials already found good
