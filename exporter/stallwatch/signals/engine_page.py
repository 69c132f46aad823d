"""Each server's own `/metrics` page, fetched by a background thread per server (never inside a scrape), and the
engine's figures read from it: requests running and waiting and tokens generated (`source="metrics"`).

The address is the health probe's (`Launch.probes`: an address of the server's own) with the engine's metrics
path; a derived one is fetched only while the server's own tree listens on the port, as the probe is. One deadline
covers each request and at most MAX_BODY_BYTES of a page are read (a real vLLM page is a few hundred KB): a larger
one counts as a failed fetch. A server that listens on loopback only inside its own network namespace is not
fetched (no `engine_metrics_up` sample: unknown), nor one whose engine serves no page or was started without the
flag that turns it on.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import LOOP_INTERVAL, positive_duration
from stallwatch.discovery.server import Server
from stallwatch.engines.base import Figures, MetricsSpec
from stallwatch.loops import PerServerLoops
from stallwatch.signals.probes import fetch

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20


@dataclass(frozen=True)
class EngineMetricsSettings(CollectorSettings):
    """The `engine_metrics:` section."""

    interval: float = setting(LOOP_INTERVAL, 10.0)  # between fetches of one server's page
    timeout: float = setting(positive_duration, 5.0)  # one deadline for each fetch


def _wanted_lines(text: str, names: Sequence[str]) -> str:
    """Only the lines of our families (samples, `# TYPE`, `# HELP`): a vLLM page holds hundreds of KB of
    histograms that the parser need not read."""
    prefixes = tuple(names) + tuple(f"# {kind} {name}" for kind in ("TYPE", "HELP") for name in names)
    return "\n".join(line for line in text.splitlines() if line.startswith(prefixes)) + "\n"


def _family_names(spec: MetricsSpec) -> list[str]:
    """The names a family line may start with: the sample names, and a counter's or histogram's family name."""
    names = [spec.running, spec.waiting, spec.tokens]
    for suffix in ("_total", "_sum"):
        names += [name[: -len(suffix)] for name in names if name.endswith(suffix)]
    return names


def _reduce(samples: Iterable[tuple[dict[str, str], float]], same_over: Sequence[str]) -> float | None:
    """Sum over label sets, after the largest value over the labels in `same_over`; None when no sample."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in samples:
        if math.isnan(value):
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in same_over))
        groups[key] = max(groups.get(key, value), value)
    return sum(groups.values()) if groups else None


def parse_page(text: str, spec: MetricsSpec) -> tuple[float, float, float]:
    """Running, waiting and generated tokens from an engine's metrics page; ValueError when one is missing."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {spec.running: [], spec.waiting: [], spec.tokens: []}
    for family in text_string_to_metric_families(_wanted_lines(text, _family_names(spec))):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name].append((sample.labels, sample.value))
    names = (spec.running, spec.waiting, spec.tokens)
    values = {name: _reduce(found[name], spec.same_over) for name in names}
    missing = [name for name in names if values[name] is None]
    if missing:
        raise ValueError(f"no samples of {', '.join(missing)}")
    odd = [name for name in names if not math.isfinite(values[name] or 0.0)]
    if odd:  # an Inf would stick in the monotonic counter for good (NaN samples are skipped above)
        raise ValueError(f"values that are not finite: {', '.join(odd)}")
    running, waiting, tokens = (float(values[name] or 0.0) for name in names)
    return running, waiting, tokens


@dataclass
class MonotonicCounter:
    """An engine counter that never goes down across an engine restart: when the engine's value drops (or its
    process changes), what it had counted before is kept as an offset."""

    offset: float = 0.0
    last: float | None = None
    launch: object = None

    def update(self, value: float, launch: object) -> float:
        if self.last is not None and (value < self.last or launch != self.launch):
            self.offset += self.last
        self.last, self.launch = value, launch
        return self.offset + value


@dataclass
class PageState:
    server: str
    up: bool | None = None  # None: no page to fetch
    figures: Figures | None = None  # the last figures read, tokens made monotonic
    counter: MonotonicCounter = field(default_factory=MonotonicCounter)
    error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


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


class EnginePageManager:
    """One fetch loop per watched server; follows the watcher as servers come and go."""

    def __init__(self, interval: float, timeout: float, wall: Callable[[], float] = time.time) -> None:
        self.interval, self.timeout, self._wall = interval, timeout, wall
        self._loops: PerServerLoops[str, Server, PageState] = PerServerLoops(
            self._step, lambda _: self.interval, lambda server: f"engine metrics {server.name}", PageState)

    def reconcile(self, servers: list[Server]) -> None:
        self._loops.reconcile({s.name: s for s in servers})  # a relaunch keeps the state: the counter goes on

    def read_now(self, server: Server) -> Page:
        """One fetch of the server's page now, with this manager's deadline."""
        return read_page(server, self.timeout)

    def _step(self, server: Server, state: PageState) -> None:
        page = self.read_now(server)
        with state.lock:
            state.up = page.up
            if page.figures is not None:
                running, waiting, tokens = page.figures
                total = state.counter.update(tokens, server.launch.key)
                state.figures = Figures(running, waiting, total, self._wall())
            if page.error and page.error != state.error:
                log.warning("engine metrics of %s: %s", server.name, page.error)
            elif not page.error and state.error:
                log.info("engine metrics of %s answer again", server.name)
            state.error = page.error

    def states(self) -> list[PageState]:
        out = []
        for state in self._loops.states():
            with state.lock:
                out.append(PageState(state.server, state.up, state.figures, error=state.error))
        return out

    def state(self, server: Server) -> PageState | None:
        return next((s for s in self.states() if s.server == server.name), None)


def figures_of(server: Server, page: PageState | None) -> tuple[str, Figures | None]:
    """The engine's figures as the exporter reads them, and their source: its page's once the page answered
    (`metrics`), else its stats lines' (`log`), else none (`""`)."""
    if page is not None and page.figures is not None:
        return "metrics", page.figures
    figures = server.interpreter.figures()
    return ("log", figures) if figures is not None else ("", None)
