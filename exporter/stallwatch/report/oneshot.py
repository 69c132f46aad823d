"""`stallwatch diagnose`: the evidence an on-call engineer gathers by hand when a server stalls, in one report.

`gather()` takes a one-shot runtime (`app.oneshot`: the watcher and signals of the same config, none of them
started), runs one discovery pass, replays each server's log tail as the exporter does at start (so the phase is
recovered), samples the process tree over a short window, dumps the Python stacks of its processes with `py-spy`,
makes one probe now and reads the engine's own figures. It waits for nothing past its deadlines, whatever the
config's timeouts and however many servers there are: the engine pages read at the window's start within the
window, and the probes, pages, stacks and GPUs after it within LOOK_SECONDS, every server at once.

A server named that its own pass cannot see (a discovered server whose process is gone: nothing of it is left in
`/proc`) is asked of the running exporter, which keeps it until `discovery.forget_after`: its report as the
status page builds it (`/servers/<name>?format=json`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar
from urllib.parse import quote

from stallwatch import __version__
from stallwatch.discovery.processes import ProcessKey, cpu_totals
from stallwatch.discovery.server import Look, Server
from stallwatch.engines.base import Figures
from stallwatch.report.model import Observation, Report
from stallwatch.report.observe import (
    UnknownServer,
    assemble,
    engine_info,
    gpu_section,
    made_in_window,
    pd_info,
    port_info,
    probe_info,
    processes_since,
    select,
)
from stallwatch.report.render import parse_json
from stallwatch.report.stacks import stacks
from stallwatch.runtime import Runtime, required
from stallwatch.signals.engine_page import PageState, figures_of
from stallwatch.signals.loaded_models import read_models
from stallwatch.signals.pd_groups import group_keys, node_name
from stallwatch.signals.probes import fetch
from stallwatch.signals.router_page import read_router

LOOK_SECONDS = 3.0  # what the look after the window may take: probes, engine pages, py-spy, the GPUs' first reading
EXPORTER_SECONDS = 2.0  # what the running exporter may take to answer for a server this look cannot see
MAX_REPORT_BYTES = 16 << 20
POOL = 16  # servers looked at at once
T = TypeVar("T")


class Deadline:
    """A moment `seconds` from now on `clock`; `left()` is what remains of it (0 once passed)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock, self._at = clock, clock() + seconds

    def left(self) -> float:
        return max(0.0, self._at - self._clock())


def gather(runtime: Runtime, name: str | None = None, window: float = 2.0, exporter: str | None = None) -> Report:
    """Discover, replay the logs, sample for `window` seconds and look at every (or the named) server once. A name
    this look cannot see is asked of the running exporter at `exporter` (its base URL), where given."""
    logs, nvml = required(runtime.logs, "logs"), required(runtime.nvml, "gpu")
    runtime.watcher.refresh()
    try:
        servers = select(runtime.watcher, name)
    except UnknownServer as unknown:
        if name is None or exporter is None:
            raise
        return from_exporter(exporter, name, unknown)
    nvml.start()  # its readers read while the window runs
    if runtime.xid is not None:  # an Xid in the window is seen
        runtime.xid.start()
    try:
        logs.poll()
        began = Deadline(window)
        before = _each(servers, lambda s: _before(s, runtime, began))
        time.sleep(began.left())
        logs.poll()
        if runtime.kernel_xids is not None:  # the kernel log's, from its start to now, read here: none is missed
            runtime.kernel_xids.read_once()
        look = Deadline(LOOK_SECONDS)
        nvml.settle(min(nvml.timeout, look.left()))
        keys = _pd_groups(servers, look)
        reports = _each(servers, lambda s: assemble(*_observe(s, runtime, before[s.name], window, look,
                                                               keys.get(s.name, ("", "")))))
    finally:
        logs.close()
        if runtime.xid is not None:
            runtime.xid.stop()
        nvml.stop()
    return Report(__version__, time.time(), [reports[s.name] for s in servers])


def _each(servers: list[Server], work: Callable[[Server], T]) -> dict[str, T]:
    """`work` on every server at once, by name: each within its own deadlines, so no server waits for another's."""
    with ThreadPoolExecutor(max_workers=max(1, min(POOL, len(servers))), thread_name_prefix="diagnose") as pool:
        return dict(zip((s.name for s in servers), pool.map(work, servers), strict=True))


def from_exporter(base: str, name: str, unknown: UnknownServer) -> Report:
    """The running exporter's report on `name`; UnknownServer, saying what it answered, when it has none."""
    url = f"{base}/servers/{quote(name.encode('utf-8', 'surrogateescape'), safe='')}?format=json"
    result, body = fetch(url, EXPORTER_SECONDS, MAX_REPORT_BYTES)
    if result.status == 404:
        raise UnknownServer(f"{unknown}; nor does the running exporter at {base} watch it")
    if not result.success or body is None:
        why = f"HTTP {result.status}" if result.status else result.reason
        raise UnknownServer(f"{unknown}; the running exporter at {base} did not answer for it ({why})")
    try:
        report = parse_json(body)
    except ValueError as exc:
        raise UnknownServer(f"{unknown}; what answers at {base} is no stallwatch report ({exc})") from exc
    if [s.name for s in report.servers] != [name]:
        raise UnknownServer(f"{unknown}; the running exporter at {base} answered for another server")
    return replace(report, from_exporter=base)


@dataclass(frozen=True)
class _Before:
    cpu: dict[ProcessKey, float]  # the tree's CPU totals when the window began
    figures: tuple[str, Figures | None, str]  # source, figures, why the page did not answer


def _before(server: Server, runtime: Runtime, deadline: Deadline) -> _Before:
    look = server.look()
    return _Before(cpu_totals(look.tree), _figures(look, _page(server, runtime, deadline)))


def _page(server: Server, runtime: Runtime, deadline: Deadline) -> PageState:
    """The engine's page read now, by `deadline`."""
    page = required(runtime.engine_pages, "engine_metrics").read_now(server, deadline.left())
    figures = Figures(*page.figures, at=time.time()) if page.figures is not None else None
    router = read_router(server, deadline.left()) if server.engine.router is not None else None
    models, _ = read_models(server, deadline.left())
    return PageState(server.name, page.up, page.loop_up, figures, error=page.error, models=models,
                     pending=page.pd.pending if page.pd is not None else None,
                     transfers=page.pd.transfers if page.pd is not None else None, router=router)


def _figures(look: Look, page: PageState) -> tuple[str, Figures | None, str]:
    """The engine's figures: its page's where it answered, else its stats lines' (as `look` saw them)."""
    return (*figures_of(look, page), page.error)


def _pd_groups(servers: list[Server], deadline: Deadline) -> dict[str, tuple[str, str]]:
    """Each PD member's group, with the workers of the routers' pages read now."""
    routers = {s.name: PageState(s.name, router=read_router(s, deadline.left()))
               for s in servers if s.engine.router is not None}
    return group_keys([s.look() for s in servers], routers, node_name())


def _observe(server: Server, runtime: Runtime, before: _Before, window: float,
             deadline: Deadline, pd: tuple[str, str] = ("", "")) -> tuple[Look, Observation]:
    """The server after the window. Its stacks and its page are taken while it is probed, all by `deadline`: a probe
    that waits it out leaves them their time."""
    prober = required(runtime.probes, "probe")
    processes = processes_since(server.look().tree, before.cpu, runtime.config.paths.procfs)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="diagnose look") as pool:
        taken = pool.submit(stacks, processes, deadline.left())
        page = pool.submit(_page, server, runtime, deadline)
        # A probe that answers makes the phase `serving`, as in the exporter: before the look the report is of.
        probes = [probe_info(target.probe.url, *prober.probe_now(target, server, deadline.left()))
                  for target in server.launch.probes]
        look = server.look()
        read = page.result()
        source, figures, error = _figures(look, read)
        groups = taken.result()
    then_source, then, _ = before.figures
    # Measured only where the figures moved on in the window (an idle engine prints no stats line).
    fresh = figures is not None and then is not None and figures.at > then.at
    made = made_in_window((then_source, then.tokens) if fresh and then is not None else None, (source, figures))
    return look, Observation(window, processes, groups, port_info(look.launch, probes),
                             engine_info((source, figures), made, error, read.models), gpu_section(look, runtime),
                             server.tail.lines() if server.tail else [], pd_info(look, read, *pd))
