"""HTTP probes of each server's health URLs, run by background threads (never inside a scrape).

Like blackbox_exporter's http prober: no redirects followed (3xx fails), at most 64 KiB of the body read,
and every failure classified as `refused`, `timeout`, `http_status` or `error`.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from stallwatch import __version__
from stallwatch.config import Probe
from stallwatch.servers import Server

log = logging.getLogger(__name__)

REASONS = ("refused", "timeout", "http_status", "error")
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Result:
    success: bool
    duration: float
    status: int  # 0 when no HTTP response came
    reason: str | None  # one of REASONS when not successful


def probe(url: str, timeout: float) -> Result:
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    start = time.monotonic()
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname or "", parts.port,
                                                 timeout=timeout, context=ssl.create_default_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    status = 0
    try:
        connection.request("GET", path, headers={"User-Agent": f"stallwatch/{__version__}", "Accept": "*/*"})
        response = connection.getresponse()
        status = response.status
        remaining = MAX_BODY_BYTES
        while remaining > 0 and time.monotonic() - start < timeout:
            chunk = response.read1(remaining) if hasattr(response, "read1") else response.read(remaining)
            if not chunk:
                break
            remaining -= len(chunk)
        reason = None if 200 <= status < 300 else "http_status"
    except ConnectionRefusedError:
        reason = "refused"
    except TimeoutError:
        reason = "timeout"
    except (OSError, http.client.HTTPException) as exc:
        log.debug("probe of %s failed: %s", url, exc)
        reason = "error"
    finally:
        connection.close()
    duration = time.monotonic() - start
    if duration > timeout and reason is None:
        reason = "timeout"  # a server that trickles its answer past the deadline
    return Result(reason is None, duration, status, reason)


@dataclass
class ProbeState:
    server: str
    url: str
    last: Result | None = None
    last_success: float | None = None
    failures: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


class _Loop:
    def __init__(self, state: ProbeState, spec: Probe, server: Server, wall: Callable[[], float]) -> None:
        self.state, self.spec, self.server, self._wall = state, spec, server, wall
        self.stop = threading.Event()
        threading.Thread(target=self._run, name=f"probe {spec.url}", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            result = probe(self.spec.url, self.spec.timeout)
            now = self._wall()
            with self.state.lock:
                self.state.last = result
                if result.success:
                    self.state.last_success = now
                else:
                    self.state.failures[result.reason or "error"] += 1
            if result.success:  # dated when it answered, not at the next scrape
                self.server.tracker.probe_succeeded(now)
            if self.stop.wait(self.spec.interval):
                return


class ProbeManager:
    """Keeps one probe loop per (server, URL); follows the watcher as servers come and go."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._lock = threading.Lock()
        self._loops: dict[tuple[str, str], _Loop] = {}

    def reconcile(self, servers: list[Server]) -> None:
        wanted = {(s.name, p.url): (p, s) for s in servers for p in s.probes}
        with self._lock:
            for key in set(self._loops) - set(wanted):
                self._loops.pop(key).stop.set()
            for key, (spec, server) in wanted.items():
                loop = self._loops.get(key)
                if loop is not None and loop.spec == spec and loop.server is server:
                    continue
                if loop is not None:
                    loop.stop.set()
                # Keep the counters when only interval or timeout changed: they must never go back.
                state = loop.state if loop is not None else ProbeState(*key)
                self._loops[key] = _Loop(state, spec, server, self._wall)

    def states(self) -> list[ProbeState]:
        out = []
        with self._lock:
            loops = list(self._loops.values())
        for loop in loops:
            with loop.state.lock:
                out.append(ProbeState(loop.state.server, loop.state.url, loop.state.last,
                                      loop.state.last_success, Counter(loop.state.failures)))
        return out
