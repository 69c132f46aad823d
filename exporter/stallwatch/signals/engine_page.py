"""Each server's own `/metrics` page, fetched by one loop per server on a pool of `loops.POOL_WORKERS` threads
(never inside a scrape), and the engine's figures read from it: requests running and waiting and tokens generated
(`source="metrics"`).

The address is the health probe's (`Launch.probes`: an address of the server's own) with the engine's metrics
path; a derived one is fetched only while the server's own tree listens on the port, as the probe is. One deadline
covers each request and at most MAX_BODY_BYTES of a page are read (a real vLLM page is a few hundred KB): a larger
one counts as a failed fetch, and so does one with more than MAX_SAMPLES samples of one family. The page is read line
by line, summing as it goes, never as a parsed model of the whole page (tiny series would cost ten times its size). A
server that listens on loopback only inside its own network namespace is not fetched (no `engine_metrics_up` sample:
unknown), nor one whose engine serves no page or was started without the flag that turns it on (or whose
page answers that it is not turned on, `MetricsSpec.absent_status`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import LOOP_INTERVAL, positive_duration
from stallwatch.discovery.server import Look, Server
from stallwatch.engines.base import Figures, MetricsSpec
from stallwatch.loops import PerServerLoops
from stallwatch.signals.loaded_models import read_models
from stallwatch.signals.page_address import page_url
from stallwatch.signals.probes import fetch
from stallwatch.signals.router_page import RouterView, read_router
from stallwatch.signals.runner_loops import read_runner_loops
from stallwatch.signals.textformat import PAIRS as _PAIRS
from stallwatch.signals.textformat import SAMPLE as _SAMPLE
from stallwatch.signals.textformat import sample_lines as _sample_lines

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20
MAX_SAMPLES = 1024  # of one family: a real engine has one per rank or DP engine


@dataclass(frozen=True)
class EngineMetricsSettings(CollectorSettings):
    """The `engine_metrics:` section."""

    interval: float = setting(LOOP_INTERVAL, 10.0)  # between fetches of one server's page
    timeout: float = setting(positive_duration, 5.0)  # one deadline for each fetch


_Groups = dict[tuple[tuple[bytes, bytes], ...], float]


def _add(groups: _Groups, name: str, rest: bytes, same_over: set[bytes]) -> None:
    """One sample into its name's sums: the largest value over the labels in `same_over` for each set of the
    others (NaN skipped); ValueError for a line that is not a sample."""
    sample = _SAMPLE.fullmatch(rest)
    if sample is None:
        raise ValueError(f"a line of {name} that is not a sample: {rest[:80]!r}")
    value = float(sample.group("value"))
    if math.isnan(value):
        return
    key = tuple(sorted(pair for pair in _PAIRS.findall(sample.group("labels") or b"") if pair[0] not in same_over))
    groups[key] = max(groups.get(key, value), value)


def _selector(text: str) -> tuple[str, tuple[bytes, bytes] | None]:
    """A sample name and the one label it is limited to: `name{label="value"}`, or a bare name."""
    name, brace, rest = text.partition("{")
    if not brace:
        return name, None
    label, _, value = rest.rstrip("}").partition("=")
    return name, (label.encode(), value.strip('"').encode())


def _sums(data: bytes, selectors: dict[str, str], same_over: set[bytes]) -> dict[str, _Groups]:
    """The groups of samples (see `_add`) of each selector (`name`, or `name{label="value"}`: only the samples
    with that label value; several may read one name), by key, in one pass over the page."""
    wanted: dict[str, list[tuple[str, tuple[bytes, bytes] | None]]] = {}
    for key, text in selectors.items():
        name, only = _selector(text)
        wanted.setdefault(name, []).append((key, only))
    groups: dict[str, _Groups] = {key: {} for key in selectors}
    samples = dict.fromkeys(wanted, 0)
    for line in _sample_lines(list(wanted)).finditer(data):
        name = line.group(1).decode()
        samples[name] += 1
        if samples[name] > MAX_SAMPLES:
            raise ValueError(f"more than {MAX_SAMPLES} samples of {name}")
        pairs = None
        for key, only in wanted[name]:
            if only is not None:
                pairs = _PAIRS.findall(line.group(2).split(b"}", 1)[0]) if pairs is None else pairs
                if only not in pairs:
                    continue
            _add(groups[key], name, line.group(2), same_over)
    return groups


class PdFigures(NamedTuple):
    """A PD member's figures from its page: requests pending by stage (those the page has), and the KV transfers
    it completed (None: the page has no such counter)."""

    pending: dict[str, float]
    transfers: float | None


def parse_pd(page: str | bytes, spec: MetricsSpec) -> PdFigures | None:
    """The PD figures of `spec.pending` and `spec.transfers` that the page has; None when it has none (a server
    that is no PD member, or an engine without them); ValueError as `parse_page`."""
    if not spec.pending and not spec.transfers:
        return None
    data = page.encode() if isinstance(page, str) else page
    same_over = {label.encode() for label in spec.same_over}
    # One name may be several stages (vLLM's `kv_fetch_by_stage{stage=...}`): each stage reads its own lines.
    by_stage = _sums(data, dict(spec.pending), same_over)
    pending = {stage: sum(groups.values()) for stage, groups in by_stage.items() if groups}
    transfers = _sums(data, {name: name for name in spec.transfers}, same_over)
    found = [sum(groups.values()) for groups in transfers.values() if groups]
    values = [*pending.values(), *found]
    if not all(math.isfinite(value) for value in values):
        raise ValueError("PD figures that are not finite")
    if not pending and not found:
        return None
    return PdFigures(pending, sum(found) if found else None)


class NoFigures(ValueError):
    """A page with none of the engine's figures."""


def parse_page(page: str | bytes, spec: MetricsSpec) -> tuple[float, float, float]:
    """Running, waiting and generated tokens from an engine's metrics page, each summed over label sets after the
    largest value over `spec.same_over`; ValueError when one is missing (NoFigures when all are), not finite or has
    too many samples."""
    data = page.encode() if isinstance(page, str) else page
    names = (spec.running, spec.waiting, spec.tokens)
    groups = _sums(data, {name: name for name in names}, {label.encode() for label in spec.same_over})
    missing = [name for name in names if not groups[name]]
    if len(missing) == len(names):
        raise NoFigures(f"no samples of {', '.join(missing)}")
    if missing:
        raise ValueError(f"no samples of {', '.join(missing)}")
    values = [sum(groups[name].values()) for name in names]
    odd = [name for name, value in zip(names, values, strict=True) if not math.isfinite(value)]
    if odd:  # an Inf would stick in the monotonic counter for good (NaN samples are skipped above)
        raise ValueError(f"values that are not finite: {', '.join(odd)}")
    running, waiting, tokens = values
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
    loop_up: bool | None = None  # the engine's main loop answered (`MetricsSpec.through_loop`); None: unknown
    figures: Figures | None = None  # the last figures read, tokens made monotonic
    counter: MonotonicCounter = field(default_factory=MonotonicCounter)
    pending: dict[str, float] | None = None  # a PD member's pending requests by stage, as last read
    transfers: float | None = None  # its KV transfers completed, made monotonic
    transfer_counter: MonotonicCounter = field(default_factory=MonotonicCounter)
    router: RouterView | None = None  # a router's view of its workers, as last read
    error: str = ""
    # Bytes of GPU memory by model the engine has loaded (`Engine.loaded_models`), from its last fetch; None: no such
    # page, or its last fetch failed.
    models: dict[str, float] | None = None
    models_error: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


def metrics_url(server: Server) -> tuple[str, bool, int | None] | None:
    """The URL of the server's metrics page, whether it was derived from its command line and the page's own port
    (None: the engine's); None when there is none to fetch from here."""
    spec = server.engine.metrics
    if spec is None or not spec.served(server.launch.argv):
        return None
    port = spec.port(server.launch.flags)
    found = page_url(server, spec.path, port)
    return None if found is None else (*found, port)


class Page(NamedTuple):
    """One read of a server's metrics page: whether it answered (None: no page to fetch), its running, waiting
    and generated-tokens figures, and what went wrong."""

    up: bool | None
    figures: tuple[float, float, float] | None
    error: str
    # For a page the engine's main loop serves: True when it answered (any HTTP status), False when the fetch timed
    # out; None otherwise (another engine, refused, not fetched).
    loop_up: bool | None = None
    pd: PdFigures | None = None  # a PD member's pending requests and transfers, where the page has them


def read_page(server: Server, timeout: float) -> Page:
    """Fetch and parse the server's metrics page once, by the rules above; where the page says nothing of the
    engine's loop, its runners' pages do (`Engine.runner_loops`)."""
    page = _read_metrics_page(server, timeout)
    if page.loop_up is None and server.engine.runner_loops is not None:
        return page._replace(loop_up=read_runner_loops(server, timeout))
    return page


def _read_metrics_page(server: Server, timeout: float) -> Page:
    found = metrics_url(server)
    if found is None:
        return Page(None, None, "")
    url, derived, port = found
    if derived and not server.own_listeners(port=port):
        return Page(False, None, "")  # not up yet (or gone): what a fetch would find, not worth a warning
    result, body = fetch(url, timeout, MAX_BODY_BYTES)
    spec = server.engine.metrics
    assert spec is not None
    loop_up = None
    if spec.through_loop and (result.status or result.reason == "timeout"):
        loop_up = result.reason != "timeout"
    if result.status in spec.absent_status:
        return Page(None, None, "")  # not turned on (`MetricsSpec.absent_status`): no page, as without its flag
    if not result.success:
        return Page(False, None, f"GET {url}: {result.reason} (HTTP {result.status})", loop_up)
    if body is None:
        return Page(False, None, f"GET {url}: the page is over {MAX_BODY_BYTES} bytes", loop_up)
    try:
        figures = parse_page(body, spec)
    except NoFigures as exc:
        if spec.may_lack_figures:
            return Page(None, None, "", loop_up)  # a page of other figures (another backend's): none of these
        return Page(False, None, f"GET {url}: {exc}", loop_up)
    except ValueError as exc:
        return Page(False, None, f"GET {url}: {exc}", loop_up)
    try:
        pd = parse_pd(body, spec)
    except ValueError as exc:  # the engine's own figures stand without them
        return Page(True, figures, f"GET {url}: PD figures: {exc}", loop_up)
    return Page(True, figures, "", loop_up, pd)


class EnginePageManager:
    """One fetch loop per watched server; follows the watcher as servers come and go."""

    def __init__(self, interval: float, timeout: float, wall: Callable[[], float] = time.time) -> None:
        self.interval, self.timeout, self._wall = interval, timeout, wall
        self._loops: PerServerLoops[str, Server, PageState] = PerServerLoops(
            self._step, lambda _: self.interval, lambda server: f"engine metrics {server.name}",
            lambda name, _: PageState(name), pool="engine page pool")

    def reconcile(self, servers: list[Server]) -> None:
        self._loops.reconcile({s.name: s for s in servers})  # a relaunch keeps the state: the counter goes on

    def read_now(self, server: Server, within: float | None = None) -> Page:
        """One fetch of the server's page now, with this manager's deadline or in `within` seconds if sooner."""
        return read_page(server, self.timeout if within is None else min(self.timeout, within))

    def _step(self, server: Server, state: PageState) -> None:
        page = self.read_now(server)
        models, models_error = read_models(server, self.timeout)
        router = read_router(server, self.timeout) if server.engine.router is not None else None
        with state.lock:
            state.models = models
            if models_error and models_error != state.models_error:
                log.warning("loaded models of %s: %s", server.name, models_error)
            state.models_error = models_error
            state.up, state.loop_up = page.up, page.loop_up
            state.router = router
            if page.figures is not None:
                running, waiting, tokens = page.figures
                total = state.counter.update(tokens, server.launch.key)
                state.figures = Figures(running, waiting, total, self._wall())
                state.pending = page.pd.pending if page.pd is not None else None
                transfers = page.pd.transfers if page.pd is not None else None
                state.transfers = (None if transfers is None
                                   else state.transfer_counter.update(transfers, server.launch.key))
            if page.error and page.error != state.error:
                log.warning("engine metrics of %s: %s", server.name, page.error)
            elif not page.error and state.error:
                log.info("engine metrics of %s answer again", server.name)
            state.error = page.error

    def states(self) -> list[PageState]:
        out = []
        for state in self._loops.states():
            with state.lock:
                out.append(PageState(state.server, state.up, state.loop_up, state.figures, error=state.error,
                                     models=dict(state.models) if state.models is not None else None,
                                     pending=state.pending, transfers=state.transfers, router=state.router))
        return out

    def state(self, server: Server) -> PageState | None:
        return next((s for s in self.states() if s.server == server.name), None)


def figures_of(look: Look, page: PageState | None) -> tuple[str, Figures | None]:
    """The engine's figures as the exporter reads them, and their source: its page's once the page answered
    (`metrics`), else its stats lines' (`log`), else none (`""`)."""
    if page is not None and page.figures is not None:
        return "metrics", page.figures
    figures = look.log.figures
    return ("log", figures) if figures is not None else ("", None)
