"""HTTP probes of each server's health URLs, one loop per (server, probe name) on a pool of `loops.POOL_WORKERS`
threads (never inside a scrape).

Like blackbox_exporter's http prober: no redirects followed (3xx fails), at most 64 KiB of the body read,
and every failure classified as `refused`, `timeout`, `http_status` or `error`. A server that listens on
loopback only inside another network namespace is probed from inside it (`setns`, opt-in: it needs
CAP_SYS_ADMIN) or not at all: `unreachable`, with no `probe_success` sample (unknown, not failing).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from stallwatch import __version__
from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import boolean
from stallwatch.discovery import netns
from stallwatch.discovery.server import ProbeTarget, Server
from stallwatch.loops import PerServerLoops
from stallwatch.text import display, terminal_safe

log = logging.getLogger(__name__)

REASONS = ("refused", "timeout", "http_status", "error", "unreachable")
MAX_BODY_BYTES = 64 * 1024
MAX_DETAIL = 200  # characters of an engine's own reason kept: a sentence, not a page


@dataclass(frozen=True)
class ProbeSettings(CollectorSettings):
    """The `probe:` section."""

    # Probe a server that listens on loopback only in its own network namespace from inside it (setns).
    enter_netns: bool = setting(boolean, False)


@dataclass(frozen=True)
class Result:
    success: bool
    duration: float
    status: int  # 0 when no HTTP response came
    reason: str | None  # one of REASONS when not successful
    # Why, in the engine's own words, where a failing answer says so (`Engine.health_message`); "" otherwise.
    detail: str = ""


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


def probe(url: str, timeout: float, message_key: str | None = None) -> Result:
    """One GET of `url` within one deadline of `timeout` seconds, at most MAX_BODY_BYTES of its body read; with
    `message_key`, a failing answer's JSON body's value there is its `detail`."""
    result, body = fetch(url, timeout, MAX_BODY_BYTES)
    if message_key is None or result.success or not body:
        return result
    return replace(result, detail=said(body, message_key))


def said(body: bytes, key: str) -> str:
    """The text at `key` of a JSON object `body`, printable and at most MAX_DETAIL characters; "" when there is
    none."""
    try:
        value = json.loads(body).get(key)
    except (ValueError, AttributeError):
        return ""
    return terminal_safe(display(value))[:MAX_DETAIL] if isinstance(value, str) else ""


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
    deadline.name, deadline.daemon = "fetch deadline", True
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
    name: str  # the probe's stable name (`ProbeTarget.name`)
    url: str  # what it gets now: a pod's restart moves it, the same loop and counters go on
    last: Result | None = None
    last_success: float | None = None
    failures: Counter[str] = field(default_factory=Counter)
    unreachable: str = ""  # why the probe cannot be made, when it cannot
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class ProbeManager:
    """Keeps one probe loop per (server, probe name); follows the watcher as servers come and go."""

    def __init__(self, procfs: str = "/proc", enter_netns: bool = False, wall: Callable[[], float] = time.time) -> None:
        self._procfs, self._enter_netns, self._wall = procfs, enter_netns, wall
        self._loops: PerServerLoops[tuple[str, str], tuple[ProbeTarget, Server], ProbeState] = PerServerLoops(
            self._step, lambda work: work[0].probe.interval, lambda work: f"probe {work[0].probe.url}",
            lambda key, work: ProbeState(*key, url=work[0].probe.url), pool="probe pool")

    def reconcile(self, servers: list[Server]) -> None:
        # Keep the counters when the URL, interval or timeout changed: they must never go back.
        self._loops.reconcile({(s.name, p.name): (p, s) for s in servers for p in s.launch.probes})

    def probe_now(self, target: ProbeTarget, server: Server, within: float | None = None) -> tuple[Result | None, str]:
        """One probe of `target` now, by the prober's rules, in its timeout or `within` seconds if sooner: the result
        (None when it cannot be made) and why not. One that answers makes the server `serving`, dated when it
        answered."""
        result, unreachable = _probe_target(target, server, self._procfs, self._enter_netns, within)
        if result is not None and result.success:
            server.interpreter.probe_succeeded(self._wall())
        return result, unreachable

    def _step(self, work: tuple[ProbeTarget, Server], state: ProbeState) -> None:
        result, unreachable = self.probe_now(*work)
        with state.lock:
            state.url, state.last, state.unreachable = work[0].probe.url, result, unreachable
            if result is not None and result.success:
                state.last_success = self._wall()
            else:
                state.failures[result.reason or "error" if result else "unreachable"] += 1

    def states(self) -> list[ProbeState]:
        out = []
        for state in self._loops.states():
            with state.lock:
                out.append(replace(state, failures=Counter(state.failures), lock=threading.Lock()))
        return out


def _probe_target(target: ProbeTarget, server: Server, procfs: str, enter_netns: bool,
                  within: float | None) -> tuple[Result | None, str]:
    """One probe of `target` now (in `within` seconds at most): the result (None when it cannot be made) and why
    not."""
    spec, pid = target.probe, target.netns_pid
    timeout = spec.timeout if within is None else min(spec.timeout, within)
    if pid is not None and not enter_netns:
        return None, ("listens on loopback only inside its network namespace: start it with --host 0.0.0.0, "
                      "or set probe.enter_netns (needs CAP_SYS_ADMIN)")
    if target.derived and not server.own_listeners():
        # Nothing of the server listens on its port: what a connect would say, without sending one.
        return Result(False, 0.0, 0, "refused"), ""
    key = server.engine.health_message
    if pid is None:
        return probe(spec.url, timeout, key), ""
    try:
        return netns.run_in_netns(procfs, pid, lambda: probe(spec.url, timeout, key), timeout + 1), ""
    except OSError as exc:
        return None, f"cannot enter its network namespace: {exc.strerror or exc}"
