"""`stallwatch diagnose`: the evidence an on-call engineer gathers by hand when a server stalls, in one report.

`gather()` takes a one-shot runtime (`app.oneshot`: the watcher and signals of the same config, none of them
started), runs one discovery pass, replays each server's log tail as the exporter does at start (so the phase is
recovered), samples the process tree over a short window, dumps the Python stacks of its processes with `py-spy`,
makes one probe now and reads the engine's own figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from stallwatch import __version__
from stallwatch.discovery.processes import ProcessKey, cpu_totals
from stallwatch.discovery.server import Look, Server
from stallwatch.engines.base import Figures
from stallwatch.report.model import Observation, Report
from stallwatch.report.observe import (
    assemble,
    engine_info,
    gpu_section,
    made_in_window,
    port_info,
    probe_info,
    processes_since,
    select,
)
from stallwatch.report.stacks import stacks
from stallwatch.runtime import Runtime, required
from stallwatch.signals.engine_page import PageState, figures_of


def gather(runtime: Runtime, name: str | None = None, window: float = 2.0) -> Report:
    """Discover, replay the logs, sample for `window` seconds and look at every (or the named) server once."""
    logs, nvml = required(runtime.logs, "logs"), required(runtime.nvml, "gpu")
    runtime.watcher.refresh()
    servers = select(runtime.watcher, name)
    nvml.start()  # its readers read while the window runs
    xids = [part for part in (runtime.xid, runtime.kernel_xids) if part is not None]  # an Xid in the window is seen,
    for part in xids:  # and the kernel log's from before
        part.start()
    try:
        logs.poll()
        before = {s.name: _before(s, runtime) for s in servers}
        time.sleep(window)
        logs.poll()
        nvml.settle(nvml.timeout)
        reports = [assemble(*_observe(s, runtime, before[s.name], window)) for s in servers]
    finally:
        logs.close()
        for part in xids:
            part.stop()
        nvml.stop()
    return Report(__version__, time.time(), reports)


@dataclass(frozen=True)
class _Before:
    cpu: dict[ProcessKey, float]  # the tree's CPU totals when the window began
    figures: tuple[str, Figures | None, str]  # source, figures, why the page did not answer


def _before(server: Server, runtime: Runtime) -> _Before:
    look = server.look()
    return _Before(cpu_totals(look.tree), _figures(server, look, runtime))


def _figures(server: Server, look: Look, runtime: Runtime) -> tuple[str, Figures | None, str]:
    """The engine's figures now: its page read now where it answers, else its stats lines' (as `look` saw them)."""
    page = required(runtime.engine_pages, "engine_metrics").read_now(server)
    figures = Figures(*page.figures, at=time.time()) if page.figures is not None else None
    return (*figures_of(look, PageState(server.name, page.up, figures)), page.error)


def _observe(server: Server, runtime: Runtime, before: _Before, window: float) -> tuple[Look, Observation]:
    prober = required(runtime.probes, "probe")
    # First: a probe that answers makes the phase `serving`, as in the exporter.
    probes = [probe_info(target.probe.url, *prober.probe_now(target, server)) for target in server.launch.probes]
    look = server.look()
    source, figures, error = _figures(server, look, runtime)
    processes = processes_since(look.tree, before.cpu, runtime.config.paths.procfs)
    then_source, then, _ = before.figures
    # Measured only where the figures moved on in the window (an idle engine prints no stats line).
    fresh = figures is not None and then is not None and figures.at > then.at
    made = made_in_window((then_source, then.tokens) if fresh and then is not None else None, (source, figures))
    return look, Observation(window, processes, stacks(processes), port_info(look.launch, probes),
                             engine_info((source, figures), made, error), gpu_section(look, runtime),
                             server.tail.lines() if server.tail else [])
