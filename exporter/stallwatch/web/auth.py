"""HTTP basic auth against the web config's bcrypt hashes, as exporter-toolkit's `web/handler.go` checks them."""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
import time
from collections.abc import Mapping

import bcrypt

# bcrypt of "fakepassword", as exporter-toolkit: unknown users cost one bcrypt too (no user enumeration by timing).
DECOY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes as exporter-toolkit's `webHandler.ServeHTTP`: unknown
    users cost a bcrypt of a decoy hash, one bcrypt runs at a time (it is slow on purpose: a flood of guesses
    takes one core, not all), and results are cached briefly (keyed by a hash of user, hash and password, never
    the password itself) so that a scraper's repeated requests do not pay bcrypt every time."""

    def __init__(self, users: Mapping[str, bytes], ttl: float = 60.0, size: int = 100) -> None:
        self.users = dict(users)
        self.ttl = ttl
        self.size = size
        self._cache: dict[bytes, tuple[bool, float]] = {}
        self._cache_lock = threading.Lock()
        self._bcrypt_lock = threading.Lock()

    def check(self, authorization: str | None) -> bool:
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        digest = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), digest or DECOY_HASH, password))).digest()
        cached = self._cached(key)
        if cached is not None:
            return cached
        with self._bcrypt_lock:
            try:
                ok = bcrypt.checkpw(password, digest or DECOY_HASH) and digest is not None
            except ValueError:  # over bcrypt's 72 bytes: Go's bcrypt refuses those too (ErrPasswordTooLong)
                ok = False
        self._remember(key, ok)
        return ok

    def _cached(self, key: bytes) -> bool | None:
        with self._cache_lock:
            entry = self._cache.get(key)
            if entry is None or entry[1] < time.monotonic():
                return None
            return entry[0]

    def _remember(self, key: bytes, ok: bool) -> None:
        with self._cache_lock:
            if len(self._cache) >= self.size:  # drop expired entries first, else the oldest
                now = time.monotonic()
                self._cache = {k: v for k, v in self._cache.items() if v[1] >= now}
                while len(self._cache) >= self.size:
                    self._cache.pop(next(iter(self._cache)))
            self._cache[key] = (ok, time.monotonic() + self.ttl)


def _basic_credentials(authorization: str | None) -> tuple[str, bytes] | None:
    if not authorization:
        return None
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", "surrogateescape"), password
