"""HTTP probes of each server's health URLs, run by background threads (never inside a scrape).

Like blackbox_exporter's http prober: no redirects followed (3xx fails), at most 64 KiB of the body read,
and every failure classified as `refused`, `timeout`, `http_status` or `error`. A server that listens on
loopback only inside another network namespace is probed from inside it (`setns`, opt-in: it needs
CAP_SYS_ADMIN) or not at all: `unreachable`, with no `probe_success` sample (unknown, not failing).
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from stallwatch import __version__
from stallwatch.discovery import netns
from stallwatch.discovery.server import ProbeTarget, Server

log = logging.getLogger(__name__)

REASONS = ("refused", "timeout", "http_status", "error", "unreachable")
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Result:
    success: bool
    duration: float
    status: int  # 0 when no HTTP response came
    reason: str | None  # one of REASONS when not successful


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """The connection and request path for `url`; ValueError for a URL that names no usable host or port."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not parts.hostname or parts.scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) URL with a host: {url!r}")
    if parts.scheme == "https":
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout,
                                           context=ssl.create_default_context()), path
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), path


def _abort(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    """At the deadline: shut the socket down, so that whatever read is blocked returns at once."""
    expired.set()
    sock = connection.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def probe(url: str, timeout: float) -> Result:
    """One GET of `url` within one deadline of `timeout` seconds, at most MAX_BODY_BYTES of its body read."""
    return fetch(url, timeout, MAX_BODY_BYTES)[0]


def fetch(url: str, timeout: float, max_body: int) -> tuple[Result, bytes | None]:
    """One GET of `url` within one deadline of `timeout` seconds for the whole request (connect, TLS, headers
    and body): the socket timeout alone applies per read, so a target that trickles a byte a second would
    hold the request for as long as it likes. The body is what came of it, None when more than `max_body`
    bytes came (the rest is not read)."""
    start = time.monotonic()
    try:
        connection, path = _connection(url, timeout)
    except ValueError as exc:  # a bad port in a configured URL: this request fails, its thread goes on
        log.debug("GET %s not made: %s", url, exc)
        return Result(False, 0.0, 0, "error"), None
    expired = threading.Event()
    deadline = threading.Timer(timeout, _abort, (connection, expired))
    deadline.daemon = True
    deadline.start()
    status, body = 0, None
    try:
        connection.request("GET", path, headers={"User-Agent": f"stallwatch/{__version__}", "Accept": "*/*"})
        response = connection.getresponse()
        status = response.status
        body = _read_body(response, start, timeout, max_body)
        reason = None if 200 <= status < 300 else "http_status"
    except ConnectionRefusedError:
        reason = "refused"
    except TimeoutError:
        reason = "timeout"
    except (OSError, http.client.HTTPException) as exc:
        log.debug("GET %s failed: %s", url, exc)
        reason = "error"
    finally:
        deadline.cancel()
        connection.close()
    duration = time.monotonic() - start
    if expired.is_set() or (duration > timeout and reason is None):
        reason = "timeout"  # cut at the deadline, or a server that trickled its answer past it
    return Result(reason is None, duration, status, reason), body


def _read_body(response: http.client.HTTPResponse, start: float, timeout: float, max_body: int) -> bytes | None:
    chunks, remaining = [], max_body + 1  # one byte more tells a body over the cap
    while remaining > 0 and time.monotonic() - start < timeout:
        chunk = response.read1(remaining) if hasattr(response, "read1") else response.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return None if remaining <= 0 else b"".join(chunks)


@dataclass
class ProbeState:
    server: str
    url: str
    last: Result | None = None
    last_success: float | None = None
    failures: Counter[str] = field(default_factory=Counter)
    unreachable: str = ""  # why the probe cannot be made, when it cannot
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class _Loop:
    def __init__(self, state: ProbeState, target: ProbeTarget, server: Server, procfs: str, enter_netns: bool,
                 wall: Callable[[], float]) -> None:
        self.state, self.target, self.server, self._wall = state, target, server, wall
        self._procfs, self._enter_netns = procfs, enter_netns
        self.stop = threading.Event()
        threading.Thread(target=self._run, name=f"probe {target.probe.url}", daemon=True).start()

    def _run(self) -> None:
        spec = self.target.probe
        while not self.stop.is_set():
            result, unreachable = self._probe_once()
            now = self._wall()
            with self.state.lock:
                self.state.last, self.state.unreachable = result, unreachable
                if result is not None and result.success:
                    self.state.last_success = now
                else:
                    self.state.failures[result.reason or "error" if result else "unreachable"] += 1
            if result is not None and result.success:  # dated when it answered, not at the next scrape
                self.server.interpreter.probe_succeeded(now)
            if self.stop.wait(spec.interval):
                return

    def _probe_once(self) -> tuple[Result | None, str]:
        return probe_target(self.target, self.server, self._procfs, self._enter_netns)


def probe_target(target: ProbeTarget, server: Server, procfs: str, enter_netns: bool) -> tuple[Result | None, str]:
    """One probe of `target` now, by the prober's rules: the result (None when it cannot be made) and why not."""
    spec, pid = target.probe, target.netns_pid
    if pid is not None and not enter_netns:
        return None, ("listens on loopback only inside its network namespace: start it with --host 0.0.0.0, "
                      "or set probe.enter_netns (needs CAP_SYS_ADMIN)")
    if target.derived and not server.own_listeners():
        # Nothing of the server listens on its port: what a connect would say, without sending one.
        return Result(False, 0.0, 0, "refused"), ""
    if pid is None:
        return probe(spec.url, spec.timeout), ""
    try:
        return netns.run_in_netns(procfs, pid, lambda: probe(spec.url, spec.timeout), spec.timeout + 1), ""
    except OSError as exc:
        return None, f"cannot enter its network namespace: {exc.strerror or exc}"


class ProbeManager:
    """Keeps one probe loop per (server, URL); follows the watcher as servers come and go."""

    def __init__(self, procfs: str = "/proc", enter_netns: bool = False, wall: Callable[[], float] = time.time) -> None:
        self._procfs, self._enter_netns, self._wall = procfs, enter_netns, wall
        self._lock = threading.Lock()
        self._loops: dict[tuple[str, str], _Loop] = {}

    def reconcile(self, servers: list[Server]) -> None:
        wanted = {(s.name, p.probe.url): (p, s) for s in servers for p in s.launch.probes}
        with self._lock:
            for key in set(self._loops) - set(wanted):
                self._loops.pop(key).stop.set()
            for key, (target, server) in wanted.items():
                loop = self._loops.get(key)
                if loop is not None and loop.target == target and loop.server is server:
                    continue
                if loop is not None:
                    loop.stop.set()
                # Keep the counters when only interval or timeout changed: they must never go back.
                state = loop.state if loop is not None else ProbeState(*key)
                self._loops[key] = _Loop(state, target, server, self._procfs, self._enter_netns, self._wall)

    def states(self) -> list[ProbeState]:
        out = []
        with self._lock:
            loops = list(self._loops.values())
        for loop in loops:
            with loop.state.lock:
                out.append(ProbeState(loop.state.server, loop.state.url, loop.state.last,
                                      loop.state.last_success, Counter(loop.state.failures), loop.state.unreachable))
        return out
