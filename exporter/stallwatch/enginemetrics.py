"""Each server's own `/metrics` page, fetched by a background thread per server (never inside a scrape).

The address is the health probe's (`Launch.probes`: an address of the server's own) with the engine's metrics
path; a derived one is fetched only while the server's own tree listens on the port, as the probe is. One deadline
covers each request and at most MAX_BODY_BYTES of a page are read (a real vLLM page is a few hundred KB): a larger
one counts as a failed fetch. A server that listens on loopback only inside its own network namespace is not
fetched (no `engine_metrics_up` sample: unknown), nor one whose engine serves no page or was started without the
flag that turns it on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

from stallwatch.discovery.server import Server
from stallwatch.engines.base import Figures
from stallwatch.enginestats import MonotonicCounter, parse_page
from stallwatch.prober import fetch

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20


@dataclass
class MetricsState:
    server: str
    up: bool | None = None  # None: no page to fetch
    figures: Figures | None = None  # the last figures read, tokens made monotonic
    counter: MonotonicCounter = field(default_factory=MonotonicCounter)
    error: str = ""


def metrics_url(server: Server) -> tuple[str, bool] | None:
    """The URL of the server's metrics page and whether it was derived from its command line; None when there is
    none to fetch from here."""
    spec = server.engine.metrics
    launch = server.launch
    if spec is None or not spec.served(launch.argv) or not launch.probes:
        return None
    target = launch.probes[0]
    if target.netns_pid is not None:
        return None
    url = urlsplit(target.probe.url)._replace(path=spec.path, query="").geturl()
    return url, target.derived


class Page(NamedTuple):
    """One read of a server's metrics page: whether it answered (None: no page to fetch), its running, waiting
    and generated-tokens figures, and what went wrong."""

    up: bool | None
    figures: tuple[float, float, float] | None
    error: str


def read_page(server: Server, timeout: float) -> Page:
    """Fetch and parse the server's metrics page once, by the rules above."""
    found = metrics_url(server)
    if found is None:
        return Page(None, None, "")
    url, derived = found
    if derived and not server.own_listeners():
        return Page(False, None, "")  # not up yet (or gone): what a fetch would find, not worth a warning
    result, body = fetch(url, timeout, MAX_BODY_BYTES)
    if not result.success:
        return Page(False, None, f"GET {url}: {result.reason} (HTTP {result.status})")
    if body is None:
        return Page(False, None, f"GET {url}: the page is over {MAX_BODY_BYTES} bytes")
    spec = server.engine.metrics
    assert spec is not None
    try:
        return Page(True, parse_page(body.decode("utf-8", "replace"), spec), "")
    except ValueError as exc:
        return Page(False, None, f"GET {url}: {exc}")


class _Loop:
    def __init__(self, server: Server, state: MetricsState, interval: float, timeout: float,
                 wall: Callable[[], float]) -> None:
        self.server, self.state, self.interval, self.timeout, self._wall = server, state, interval, timeout, wall
        self.lock = threading.Lock()
        self.stop = threading.Event()
        threading.Thread(target=self._run, name=f"engine metrics {server.name}", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._once()
            except Exception:
                log.exception("engine metrics of %s failed", self.server.name)
            if self.stop.wait(self.interval):
                return

    def _once(self) -> None:
        page = read_page(self.server, self.timeout)
        if page.figures is None:
            self._set(page.up, None, page.error)
            return
        running, waiting, tokens = page.figures
        with self.lock:
            total = self.state.counter.update(tokens, self.server.launch.key)
        self._set(True, Figures(running, waiting, total, self._wall()), "")

    def _set(self, up: bool | None, figures: Figures | None, error: str) -> None:
        with self.lock:
            self.state.up = up
            if figures is not None:
                self.state.figures = figures
            if error and error != self.state.error:
                log.warning("engine metrics of %s: %s", self.server.name, error)
            elif not error and self.state.error:
                log.info("engine metrics of %s answer again", self.server.name)
            self.state.error = error

    def snapshot(self) -> MetricsState:
        with self.lock:
            return MetricsState(self.state.server, self.state.up, self.state.figures)


class EngineMetricsManager:
    """One fetch loop per watched server; follows the watcher as servers come and go."""

    def __init__(self, interval: float, timeout: float, wall: Callable[[], float] = time.time) -> None:
        self.interval, self.timeout, self._wall = interval, timeout, wall
        self._lock = threading.Lock()
        self._loops: dict[str, _Loop] = {}

    def reconcile(self, servers: list[Server]) -> None:
        wanted = {s.name: s for s in servers}
        with self._lock:
            for name in set(self._loops) - set(wanted):
                self._loops.pop(name).stop.set()
            for name, server in wanted.items():
                loop = self._loops.get(name)
                if loop is None or loop.server is not server:
                    if loop is not None:
                        loop.stop.set()
                    state = loop.state if loop is not None else MetricsState(name)  # the counter goes on
                    self._loops[name] = _Loop(server, state, self.interval, self.timeout, self._wall)

    def states(self) -> list[MetricsState]:
        with self._lock:
            loops = list(self._loops.values())
        return [loop.snapshot() for loop in loops]
