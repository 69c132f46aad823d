"""HTTP basic auth against the web config's bcrypt hashes, as exporter-toolkit's `web/handler.go` checks them.

Unlike Go, each request here holds one of a fixed pool of HTTP workers, so guesses must not queue on the bcrypt
mutex: one bcrypt runs at a time, one more check may wait for it, and the rest are answered at once (busy: 429).
Results are remembered, successes apart from failures, so that a scraper never waits for bcrypt again and no number
of wrong guesses pushes its entry out.

Turns at bcrypt are given per user name and per client, not first come first served, so that a flood of wrong
passwords cannot keep a scraper whose password is not cached yet (after every restart, all of them) out
(docs/research/audit-2026-12-02.md #9: 16 connections guessing as fast as they were answered took every turn, and
a cold scraper got 429 for as long as the flood lasted). A check's lane is its user name when the config has it,
else one lane that all unknown names share. A client is its address (an IPv6 one by its /64, which one host is
usually given whole), in its network (an IPv4 /24, an IPv6 /48):
- one check at a time per (client, user name): its other guesses meanwhile get 429 without waiting;
- after a wrong password, that (client, user name) waits `FAILURE_DELAY` s before its next check, doubling with each
  further failure up to `MAX_FAILURE_DELAY` (a success forgets them);
- the waiting turn goes first to clients let in within the last `RECENT` s that have not failed since (a rotated
  password, a new replica on a scraper's host), then to clients that have not failed in the last `RECENT` s, then to
  those whose network has not either, then to checks whose lane has not: a guess ranked after another waits only
  while no cleaner one wants the turn, and gives it up when one comes.
So a scraper from a host let in before is checked right after the bcrypt running when it comes, whatever the flood;
so is one whose user name is not the one being guessed from the flood's own address (a neighbour on the node) or
network, random user names included: there the guesses rank as it does but for their lane, one that failed. The
price: under a flood of its own, a client can tell configured user names from others by which of its guesses get a
turn (one check's timing still tells nothing: the decoy hash).
The bound, for an attacker on many addresses: each address guesses one user's password at most once per
`MAX_FAILURE_DELAY` once its delay has grown, and all of them together at most one bcrypt at a time (one core). A
scraper whose own user name is being guessed, from a network with no recent failure, shares the waiting turn only
with first guesses from networks that never failed: an attacker must use a new /24 (IPv6 /48) for each guess to keep
it out (429, retry after 1 s), while that lasts. A scraper behind the attacker's own address and user name waits out
that pair's delay: nothing but bcrypt tells its password from a guess. The table of clients is bounded (`CLIENTS`,
oldest dropped), so that addresses cost bounded memory; a dropped record only forgets failures and a success;
there is one lane record per configured user and one for the rest.
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import ipaddress
import itertools
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import bcrypt

WAITING = 1  # checks that may wait while a bcrypt runs: the next one starts without a gap, the rest are refused
FAILURE_DELAY = 1.0  # seconds a (client, user name) waits after a wrong password, doubling with each further one
MAX_FAILURE_DELAY = 30.0
RECENT = 600.0  # seconds a failure lowers its client's and its network's rank for the waiting turn
CLIENTS = 4096  # (client, user name), client and network records kept, the least recently seen dropped first


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


def client_of(peer: str) -> tuple[str, str]:
    """The client a peer address counts as and its network: an IPv4 address (IPv4-mapped ones too) and its /24, an
    IPv6 address's /64 and /48; the peer string as it is, twice, when it is no address (a Unix socket)."""
    try:
        ip = ipaddress.ip_address(peer.split("%")[0])
    except ValueError:
        return peer, peer
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefixes = (64, 48) if ip.version == 6 else (32, 24)
    client, network = (ipaddress.ip_network((ip, bits), strict=False) for bits in prefixes)
    return str(ip) if ip.version == 4 else str(client), str(network)


@dataclass
class _Client:
    failures: int = 0
    not_before: float = 0.0  # monotonic time before which a check of this (client, user name) is refused
    busy: bool = False  # a check of it waits or runs
    failed_at: float = -RECENT  # monotonic time of the last failure (client and network records)
    let_in_at: float = -RECENT  # monotonic time of the last success, unless it failed since (client records)


@dataclass
class _Ticket:
    rank: tuple[bool, bool, bool, bool, int]  # (client not let in, client, network, lane failed; arrival): lowest first
    bumped: bool = False


class _Turns:
    """Turns at bcrypt: one runs, `WAITING` wait, by rank; see the module's docstring."""

    def __init__(self, size: int = CLIENTS, clock: Callable[[], float] = time.monotonic) -> None:
        self._size = size
        self._clock = clock
        self._clients: collections.OrderedDict[tuple[str, str | None], _Client] = collections.OrderedDict()
        self._lanes: dict[str | None, _Client] = {}  # the configured user names and None (any other): bounded
        self._queue: list[_Ticket] = []
        self._running = False
        self._arrivals = itertools.count()
        self._cond = threading.Condition()

    def _client(self, key: tuple[str, str | None]) -> _Client:
        client = self._clients.pop(key, None) or _Client()
        self._clients[key] = client
        if len(self._clients) > self._size:
            self._clients.popitem(last=False)
        return client

    def take(self, client: tuple[str, str], user: str, lane: str | None) -> bool:
        """Wait for this check's turn; False: refused now (429), because that (client, user name) has a check in
        flight or waits out a failure, or the waiting turn is held by a check that ranks first."""
        with self._cond:
            now = self._clock()
            pair = self._client((client[0], user))
            if pair.busy or now < pair.not_before:
                return False
            address, network = (self._client((key, None)) for key in client)
            records = (address, network, self._lanes.setdefault(lane, _Client()))
            failed = (now - record.failed_at < RECENT for record in records)
            ticket = _Ticket((now - address.let_in_at >= RECENT, *failed, next(self._arrivals)))
            if self._running or self._queue:
                if len(self._queue) >= WAITING:
                    last = max(self._queue, key=lambda t: t.rank)
                    if last.rank < ticket.rank:
                        return False
                    last.bumped = True  # a check that ranks first takes the waiting turn of the last
                    self._queue.remove(last)
                    self._cond.notify_all()
                self._queue.append(ticket)
                pair.busy = True
                while self._running or min(self._queue, key=lambda t: t.rank) is not ticket:
                    self._cond.wait()
                    if ticket.bumped:
                        pair.busy = False
                        return False
                self._queue.remove(ticket)
            pair.busy = self._running = True
            return True

    def let_in(self, address: str) -> None:
        """A success from the cache keeps its client ahead. No lock, so that a cached request never waits: a record
        not there (dropped, or never checked from that address) stays so, and one that fails meanwhile may keep its
        rank until its next failure."""
        record = self._clients.get((address, None))
        if record is not None:
            record.let_in_at = self._clock()

    def done(self, client: tuple[str, str], user: str, lane: str | None, ok: bool) -> None:
        with self._cond:
            self._running = False
            now = self._clock()
            pair, address = self._client((client[0], user)), self._client((client[0], None))
            pair.busy = False
            if ok:
                pair.failures, pair.not_before, address.failed_at, address.let_in_at = 0, 0.0, -RECENT, now
            else:
                address.let_in_at = -RECENT
                pair.failures += 1
                pair.not_before = now + min(MAX_FAILURE_DELAY, FAILURE_DELAY * 2 ** (pair.failures - 1))
                for record in (address, self._client((client[1], None)), self._lanes.setdefault(lane, _Client())):
                    record.failed_at = now
            self._cond.notify_all()

class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes as exporter-toolkit's `webHandler.ServeHTTP`: unknown
    users cost a bcrypt of a decoy hash made at load with the highest configured cost (so timing does not tell
    users apart), and results are cached (keyed by a hash of user, hash and password, never the password itself;
    a result never changes, so entries do not expire, as in exporter-toolkit)."""

    def __init__(self, users: Mapping[str, bytes], size: int = 100,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.users = dict(users)
        self.decoy = bcrypt.hashpw(secrets.token_hex(16).encode(),
                                   bcrypt.gensalt(max((cost(d) for d in self.users.values()), default=10)))
        self._granted = _Results(size)
        self._denied = _Results(size)
        self._turns = _Turns(clock=clock)

    def check(self, authorization: str | None, peer: str = "") -> bool | None:
        """True: let in; False: refused (401); None: not checked now, because `peer` has no turn at bcrypt (429: try
        again later)."""
        credentials = _basic_credentials(authorization)
        if credentials is None:
            return False
        user, password = credentials
        digest = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode("utf-8", "surrogateescape"), digest or self.decoy,
                                         password))).digest()
        if key in self._granted:
            self._turns.let_in(client_of(peer)[0])
            return True
        if key in self._denied:
            return False
        client, lane = client_of(peer), user if digest is not None else None
        if not self._turns.take(client, user, lane):
            return None
        ok = False
        try:
            ok = self._bcrypt(password, digest)  # slow on purpose, one at a time: a flood takes one core, not all
        finally:
            self._turns.done(client, user, lane, ok)
        (self._granted if ok else self._denied).add(key)
        return ok

    def _bcrypt(self, password: bytes, digest: bytes | None) -> bool:
        try:
            return bcrypt.checkpw(password, digest or self.decoy) and digest is not None
        except ValueError:  # over bcrypt's 72 bytes: Go's bcrypt refuses those too (ErrPasswordTooLong)
            return False


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
