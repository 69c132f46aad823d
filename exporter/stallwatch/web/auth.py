"""HTTP basic auth against the web config's bcrypt hashes, as exporter-toolkit's `web/handler.go` checks them.

Unlike Go, each request here holds one of a fixed pool of HTTP workers, so guesses must not queue on the bcrypt
mutex: one bcrypt runs at a time, one more check may wait for it, and the rest are answered at once (busy: 429).
Results are remembered, successes apart from failures, so that a scraper never waits for bcrypt again and no number
of wrong guesses pushes its entry out.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import threading
from collections.abc import Mapping

import bcrypt

WAITING = 1  # checks that may wait while a bcrypt runs: the next one starts without a gap, the rest are refused


def cost(digest: bytes) -> int:
    """The cost of a `$2y$12$...` hash (the config checked its form)."""
    return int(digest.split(b"$")[2])


class _Results:
    """Keys of checked credentials, the oldest dropped past `size`. Lookups take no lock (a dict lookup is atomic),
    so that a cached request never waits, even behind an insert."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._keys: dict[bytes, None] = {}
        self._lock = threading.Lock()

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def add(self, key: bytes) -> None:
        with self._lock:
            if len(self._keys) >= self.size:
                del self._keys[next(iter(self._keys))]
            self._keys[key] = None


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes as exporter-toolkit's `webHandler.ServeHTTP`: unknown
    users cost a bcrypt of a decoy hash made at load with the highest configured cost (so timing does not tell
    users apart), and results are cached (keyed by a hash of user, hash and password, never the password itself;
    a result never changes, so entries do not expire, as in exporter-toolkit)."""

    def __init__(self, users: Mapping[str, bytes], size: int = 100) -> None:
        self.users = dict(users)
        self.decoy = bcrypt.hashpw(secrets.token_hex(16).encode(),
                                   bcrypt.gensalt(max((cost(d) for d in self.users.values()), default=10)))
        self._granted = _Results(size)
        self._denied = _Results(size)
        self._bcrypt_lock = threading.Lock()
        self._admitted = threading.BoundedSemaphore(1 + WAITING)

    def check(self, authorization: str | None) -> bool | None:
        """True: let in; False: refused (401); None: not checked, because a bcrypt runs and another check waits for
        it (429: try again later)."""
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        digest = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogateescape"), digest or self.decoy,
                                         password))).digest()
        if key in self._granted:
            return True
        if key in self._denied:
            return False
        ok = self._bcrypt(password, digest)
        if ok is not None:
            (self._granted if ok else self._denied).add(key)
        return ok

    def _bcrypt(self, password: bytes, digest: bytes | None) -> bool | None:
        if not self._admitted.acquire(blocking=False):
            return None
        try:
            with self._bcrypt_lock:  # slow on purpose: a flood of guesses takes one core, not all
                return bcrypt.checkpw(password, digest or self.decoy) and digest is not None
        except ValueError:  # over bcrypt's 72 bytes: Go's bcrypt refuses those too (ErrPasswordTooLong)
            return False
        finally:
            self._admitted.release()


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
