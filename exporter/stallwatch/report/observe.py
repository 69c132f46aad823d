"""What is seen of a server, shared by the one-shot report (`oneshot`) and the live one (`live`): its identity,
phase, GPUs, processes with their CPU over a window, port and probes, and the engine's figures; and the report
assembled from what was seen, with its verdict. Everything here is built from values: a server's `Look` (one
`Server.look()`), the devices and probe results read, never the live server."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping

from stallwatch.discovery.processes import ProcSample
from stallwatch.discovery.server import Launch, Look, Server
from stallwatch.discovery.watcher import Watcher
from stallwatch.engines.base import Figures
from stallwatch.procfs import pid_path, read_bounded
from stallwatch.report.model import (
    DeploymentInfo,
    EngineInfo,
    GpuInfo,
    GpuSection,
    Identity,
    LogInfo,
    Observation,
    PdInfo,
    PhaseInfo,
    PortInfo,
    ProbeInfo,
    ProcessInfo,
    ServerReport,
    Verdict,
    XidInfo,
)
from stallwatch.report.verdict import verdict
from stallwatch.runtime import Runtime
from stallwatch.signals.devices import Device, server_memory
from stallwatch.signals.engine_page import PageState
from stallwatch.signals.kmsg import KernelXid
from stallwatch.signals.probes import Result
from stallwatch.signals.xid import XidCount, xid_class


class UnknownServer(LookupError):
    """The name given is not a watched server."""


def select(watcher: Watcher, name: str | None) -> list[Server]:
    """Every watched server by name, or the one named."""
    servers = sorted(watcher.servers(), key=lambda s: s.name)
    if name is None:
        return servers
    chosen = [s for s in servers if s.name == name]
    if not chosen:
        known = ", ".join(s.name for s in servers) or "none"
        raise UnknownServer(f"no watched server named {name!r} (watched: {known})")
    return chosen


def assemble(look: Look, seen: Observation) -> ServerReport:
    """The report on a server from one look at it and what was seen of it, with the verdict on both."""
    launch = look.launch
    events = {event: count for event, count in sorted(look.log.events.items()) if count}
    facts = ServerReport(
        name=look.name, identity=dataclasses.replace(identity(look), pd=seen.pd), phase=phase_info(look),
        gpu=seen.gpu,
        window_seconds=seen.window, processes=seen.processes, stacks=seen.stacks, port=seen.port,
        engine_figures=seen.engine, log=LogInfo([source.path for source in launch.log_sources], seen.log_lines, events),
        verdict=Verdict("", ""))
    stall = look.spec.stall
    return dataclasses.replace(facts, verdict=verdict(facts, stall.gpu_memory_bytes, stall.log_stale))


def identity(look: Look) -> Identity:
    launch = look.launch
    w, member = launch.workload, launch.member
    deployment = None
    if member is not None:
        deployment = DeploymentInfo(member.deployment, member.role, member.node_rank, member.nnodes,
                                    *(look.ranks if look.ranks is not None else (None, None)))
    return Identity(look.engine.name, launch.model, launch.tensor_parallel, w.runtime, w.namespace, w.pod,
                    w.container, w.unit, launch.pid, launch.port, deployment, look.configured)


def pd_info(look: Look, page: PageState | None, group: str, role: str = "") -> PdInfo | None:
    """The server's place in its PD group: its role, its group, what it holds pending (its page's figures where it
    has them, else its batch lines'), its transfers and, for a router, its view of its workers; None for a server
    that is no member (or whose role no router on this node gives)."""
    role = role or (look.launch.pd.role if look.launch.pd is not None else "")
    if not role:
        return None
    pending = (page.pending if page is not None and page.pending else None) or look.log.pending or {}
    return PdInfo(group, role, dict(sorted(pending.items())),
                  page.transfers if page is not None else None,
                  dict(sorted(page.router.workers.items())) if page is not None and page.router is not None else {})


def phase_info(look: Look) -> PhaseInfo:
    snap = look.log
    now = time.time()
    return PhaseInfo(
        phase=snap.phase, since=snap.since, seconds=max(0.0, now - snap.since),
        quiet_seconds=max(0.0, now - (snap.progress if snap.progress is not None else snap.since)),
        timeline=list(snap.timeline),
        timeline_note="phases of the current launch in order, from the log replay; their times are not in the log "
                      "tail (the exporter's state timeline panel has them)",
        shards_loaded=snap.shards_loaded, shards_expected=snap.shards_expected, stop_requested=snap.stop_requested)


def gpu_section(look: Look, runtime: Runtime) -> GpuSection:
    """The GPUs now, each with what the server holds on it, its power and recovery action and the Xids it reported
    (NVML's events, with the kernel log's last line of each where it is readable); no NVML in the runtime: the gpu
    collector is off (and NVML is left alone)."""
    if runtime.nvml is None:
        return GpuSection(False, "the gpu collector is disabled")
    found = runtime.nvml.read_devices()
    if not found.up:
        return GpuSection(False, found.error)
    # A GPU that does not answer now (Xid 119: its calls hang) is shown from its last answer, with what the server
    # held on it then, so that its fault is still the server's.
    silent = [f.last for f in found.failed if f.last is not None]
    held = {device.index: memory for device, memory in server_memory(look, [*found.devices, *silent])}
    events = {(c.uuid, int(c.xid)): c for c in (runtime.xid.counts() if runtime.xid is not None else [])}
    lines = {(line.pci, line.xid): line
             for line in (runtime.kernel_xids.latest() if runtime.kernel_xids is not None else [])}
    roles = {s.pid: s.role for s in look.tree}
    gpus = [GpuInfo(d.index, d.uuid, d.name, d.used, d.total, held.get(d.index), d.utilization, d.busy_ratio,
                    d.busy_window, d.health.power_watts, d.health.power_limit_watts,
                    None if d.health.recovery_action is None else int(d.health.recovery_action),
                    _xids(d, events, lines, roles)) for d in found.devices]
    gpus += [GpuInfo(d.index, d.uuid, d.name, d.used, d.total, held.get(d.index), None, None, 0.0,
                     xids=_xids(d, events, lines, roles), answering=False) for d in silent]
    gpus.sort(key=lambda g: int(g.index))
    errors = [f"GPU {f.index} did not answer: {type(f.error).__name__}" for f in found.failed]
    return GpuSection(True, "; ".join(errors), gpus)


def _xids(device: Device, events: Mapping[tuple[str, int], XidCount], lines: Mapping[tuple[str, int], KernelXid],
          roles: Mapping[int, str]) -> list[XidInfo]:
    """The Xids of one GPU, most recent first: NVML's count of each, and the kernel log's last line of it."""
    now = time.time()
    numbers = {x for uuid, x in events if uuid == device.uuid} | {x for pci, x in lines if pci == device.pci}
    out = []
    for number in numbers:
        event, line = events.get((device.uuid, number)), lines.get((device.pci or "", number))
        last = max(event.last if event else float("-inf"), line.at if line else float("-inf"))
        known = xid_class(number)
        out.append(XidInfo(number, event.count if event else 0, max(0.0, now - last), known.kind, known.meaning,
                           line.pid if line else None, line.process if line else "",
                           roles.get(line.pid, "") if line and line.pid is not None else "",
                           line.detail if line else ""))
    return sorted(out, key=lambda x: x.seconds_ago)


def processes_since(tree: Iterable[ProcSample], earlier: Mapping[tuple[int, float], float],
                    procfs: str) -> list[ProcessInfo]:
    """The tree now, with the CPU seconds each process used since `earlier` (its totals by pid and start time:
    `processes.cpu_totals` of a tree taken before)."""
    out = []
    for s in tree:
        used = s.cpu_user + s.cpu_system - earlier.get((s.pid, s.create_time), s.cpu_user + s.cpu_system)
        out.append(ProcessInfo(s.pid, s.role, s.state, max(0.0, used), _wchan(procfs, s.pid) if s.state == "D" else ""))
    return out


def _wchan(procfs: str, pid: int) -> str:
    """The kernel function a process in D state waits in (a symbol name, ASCII)."""
    try:
        return read_bounded(pid_path(procfs, pid, "wchan"), 4096).decode("ascii", "replace").strip() or "?"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def probe_info(url: str, result: Result | None, why: str) -> ProbeInfo:
    """One probe's result (None: not made, and `why`); a failure's reason with the engine's own words after it
    (`http_status: Backend scheduler_tick has not advanced for 95.3s.`)."""
    if result is None:
        return ProbeInfo(url, None, 0, why, 0.0)
    reason = ": ".join(part for part in (result.reason or "", result.detail) if part)
    return ProbeInfo(url, result.success, result.status, reason, result.duration)


def port_info(launch: Launch, probes: list[ProbeInfo]) -> PortInfo:
    listening = None if launch.listening is None else bool(launch.listening)
    return PortInfo(launch.port, listening, list(launch.listening or ()), probes)


def made_in_window(then: tuple[str, float] | None, now: tuple[str, Figures | None]) -> float | None:
    """The tokens generated since `then` (a source and its token count), where it and `now` count from the same
    source: the engine's page and its stats lines count from different starts."""
    source, figures = now
    if then is None or figures is None or then[0] != source:
        return None
    return figures.tokens - then[1]


def engine_info(figures: tuple[str, Figures | None], made: float | None, error: str,
                models: dict[str, float] | None = None) -> EngineInfo:
    """The engine's figures (`signals.engine_page.figures_of`), the tokens `made` over the window where measured,
    why its page did not answer, and the models it has loaded (`signals.loaded_models`)."""
    source, found = figures
    if found is None:
        return EngineInfo("", None, None, None, None, error, models)
    return EngineInfo(source, found.running, found.waiting, found.tokens, made, error, models)
