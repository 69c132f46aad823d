"""`stallwatch diagnose`: the evidence an on-call engineer gathers by hand when a server stalls, in one report.

`gather()` builds the exporter's watcher from the same config, runs one discovery pass, replays each server's log
tail as the exporter does at start (so the phase is recovered), samples the process tree over a short window,
dumps the Python stacks of its processes with `py-spy`, makes one probe now and reads the engine's own figures;
`render_text()` and `render_json()` print the dataclass report. The verdict follows the alert rules
(`rules/stallwatch.rules.yml`) on what one look can see: GPU utilization now stands for the rules' 5-minute idle
window, and the token counter over the sample window for their 2-minute one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

from stallwatch import __version__
from stallwatch.collectors.engine_metrics import EngineMetricsSettings
from stallwatch.collectors.gpu import Device, read_device, server_memory
from stallwatch.collectors.probe import ProbeSettings
from stallwatch.config import Config
from stallwatch.discovery.processes import ProcSample
from stallwatch.discovery.server import Server
from stallwatch.discovery.watcher import Watcher
from stallwatch.enginemetrics import read_page
from stallwatch.logfollow import LogManager
from stallwatch.nvml import BusyIntegrator, Nvml
from stallwatch.prober import probe_target
from stallwatch.text import printable

PYSPY_TIMEOUT = 10.0
IDLE_RATIO = 0.005  # the rules' idle threshold on the busiest GPU's utilization
STARTUP = ("launching", "loading_weights", "allocating_memory", "capturing_graphs", "warming_up")
# Frames that show a process waiting: collectives, graph capture, queues, locks, sockets, sleeps.
WAIT_FRAME = re.compile(
    r"nccl|all_reduce|all_gather|reduce_scatter|broadcast|barrier|capture|recv|(^|_)get$|acquire|wait|sleep"
    r"|select|poll|join|lock", re.IGNORECASE)
THREAD_LINE = re.compile(r'^Thread (\S+) \(([^)]*)\): "(.*)"\s*$')
FRAME_LINE = re.compile(r"^ {4}(\S.*?) \((.*)\)\s*$")


class UnknownServer(LookupError):
    """The name given is not a watched server."""


# -- the report --------------------------------------------------------------------------------------------------
@dataclass
class Identity:
    engine: str
    model: str
    tensor_parallel: str
    runtime: str
    namespace: str
    pod: str
    container: str
    unit: str
    pid: int | None
    port: int | None


@dataclass
class PhaseInfo:
    phase: str
    since: float
    seconds: float
    quiet_seconds: float  # since the last log line that is not a heartbeat (else since the phase began)
    timeline: list[str]
    timeline_note: str
    shards_loaded: int | None
    shards_expected: int | None


@dataclass
class GpuInfo:
    index: str
    uuid: str
    name: str
    memory_used_bytes: float
    memory_total_bytes: float
    server_memory_bytes: float | None  # held by this server; None: not one of its GPUs
    utilization: float | None
    busy_ratio: float | None  # mean utilization over NVML's buffer of recent samples (the last minutes at most)
    busy_window_seconds: float  # the span of those samples


@dataclass
class GpuSection:
    nvml_up: bool
    error: str
    gpus: list[GpuInfo] = field(default_factory=list)


@dataclass
class ProcessInfo:
    pid: int
    role: str
    state: str
    cpu_seconds: float  # over the sample window
    wchan: str  # the kernel wait channel of a process in D state


@dataclass
class Frame:
    function: str
    location: str
    wait: bool


@dataclass
class ThreadStack:
    name: str
    status: str
    frames: list[Frame]


@dataclass
class StackGroup:
    """Processes whose stacks are identical (TP ranks), printed once."""

    roles: list[str]
    pids: list[int]
    threads: list[ThreadStack]
    error: str  # why py-spy gave no stack


@dataclass
class ProbeInfo:
    url: str
    success: bool | None  # None: not made
    status: int
    reason: str
    duration_seconds: float


@dataclass
class PortInfo:
    port: int | None
    listening: bool | None
    addresses: list[str]
    probes: list[ProbeInfo]


@dataclass
class EngineInfo:
    source: str  # metrics | log | "" (none)
    running: float | None
    waiting: float | None
    tokens: float | None
    tokens_in_window: float | None  # generated during the sample window; None when not measured
    error: str


@dataclass
class LogInfo:
    sources: list[str]
    lines: list[str]
    events: dict[str, int]


@dataclass
class Verdict:
    status: str  # healthy | starting | stalled | failed | down
    text: str


@dataclass
class ServerReport:
    name: str
    identity: Identity
    phase: PhaseInfo
    gpu: GpuSection
    window_seconds: float
    processes: list[ProcessInfo]
    stacks: list[StackGroup]
    port: PortInfo
    engine_figures: EngineInfo
    log: LogInfo
    verdict: Verdict


@dataclass
class Report:
    version: str
    generated_at: float
    servers: list[ServerReport]

    @property
    def exit_code(self) -> int:
        return 1 if any(s.verdict.status in ("stalled", "failed", "down") for s in self.servers) else 0


# -- gathering ---------------------------------------------------------------------------------------------------
def select(watcher: Watcher, name: str | None) -> list[Server]:
    servers = sorted(watcher.servers(), key=lambda s: s.name)
    if name is None:
        return servers
    chosen = [s for s in servers if s.name == name]
    if not chosen:
        known = ", ".join(s.name for s in servers) or "none"
        raise UnknownServer(f"no watched server named {name!r} (watched: {known})")
    return chosen


def gather(config: Config, name: str | None = None, window: float = 2.0) -> Report:
    """Discover, replay the logs, sample for `window` seconds and look at every (or the named) server once."""
    # Run on the node by its admin, the report shows the evidence: each server keeps its log's tail.
    config = dataclasses.replace(config, web=dataclasses.replace(config.web, show_evidence=True))
    watcher = Watcher(config)
    watcher.refresh()
    servers = select(watcher, name)
    logs = LogManager(watcher, 1.0, replay_events=True)
    try:
        logs.poll()
        before = {s.name: _before(s, config) for s in servers}
        time.sleep(window)
        logs.poll()
        reports = [assemble(s, _observe(s, config, before[s.name], window)) for s in servers]
    finally:
        logs.close()
    return Report(__version__, time.time(), reports)


@dataclass
class _Before:
    tree: list[ProcSample]
    tokens: tuple[str, float, float] | None  # source, tokens, when seen


def _before(server: Server, config: Config) -> _Before:
    return _Before(server.tree(), _tokens(server, config))


def _tokens(server: Server, config: Config) -> tuple[str, float, float] | None:
    timeout = config.collector("engine_metrics", EngineMetricsSettings).timeout
    page = read_page(server, timeout)
    if page.figures is not None:
        return "metrics", page.figures[2], time.time()
    figures = server.interpreter.figures()
    return None if figures is None else ("log", figures.tokens, figures.at)


@dataclass
class Observation:
    """What was seen of a server: by diagnose's own look over a short window, or from the exporter's running
    state (`stallwatch.status`). Log lines and stacks are empty where they are not to be shown."""

    window: float
    processes: list[ProcessInfo]
    stacks: list[StackGroup]
    port: PortInfo
    engine: EngineInfo
    gpu: GpuSection
    log_lines: list[str]


def _observe(server: Server, config: Config, before: _Before, window: float) -> Observation:
    port = _port(server, config)  # first: a probe that answers makes the phase `serving`, as in the exporter
    earlier = {(s.pid, s.create_time): s.cpu_user + s.cpu_system for s in before.tree}
    processes = processes_since(server, earlier, config.paths.procfs)
    return Observation(window, processes, stacks(processes), port, _engine(server, config, before.tokens),
                       gpus(server, Nvml(sample_interval=1.0)), server.tail.lines() if server.tail else [])


def assemble(server: Server, seen: Observation) -> ServerReport:
    """The report on `server` from what was seen of it, with the verdict."""
    events = {event: count for event, count in sorted(server.interpreter.snapshot().events.items()) if count}
    report = ServerReport(
        name=server.name, identity=_identity(server), phase=_phase(server), gpu=seen.gpu, window_seconds=seen.window,
        processes=seen.processes, stacks=seen.stacks, port=seen.port, engine_figures=seen.engine,
        log=LogInfo([source.path for source in server.launch.log_sources], seen.log_lines, events),
        verdict=Verdict("", ""))
    report.verdict = verdict(report, server.spec.stall.gpu_memory_bytes, server.spec.stall.log_stale)
    return report


def _identity(server: Server) -> Identity:
    launch = server.launch
    w = launch.workload
    return Identity(server.engine.name, launch.model, launch.tensor_parallel, w.runtime, w.namespace, w.pod,
                    w.container, w.unit, launch.pid, launch.port)


def _phase(server: Server) -> PhaseInfo:
    snap = server.interpreter.snapshot()
    now = time.time()
    progress = server.interpreter.progress()
    return PhaseInfo(
        phase=snap.phase, since=snap.since, seconds=max(0.0, now - snap.since),
        quiet_seconds=max(0.0, now - (progress if progress is not None else snap.since)),
        timeline=server.interpreter.timeline(),
        timeline_note="phases of the current launch in order, from the log replay; their times are not in the log "
                      "tail (the exporter's state timeline panel has them)",
        shards_loaded=snap.shards_loaded, shards_expected=snap.shards_expected)


def gpus(server: Server, nvml: Nvml) -> GpuSection:
    if not nvml.available():
        return GpuSection(False, "NVML unavailable (no driver, or no access to it)")
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return GpuSection(False, f"NVML: {exc}")
    devices: list[Device] = []
    errors = []
    for index in range(count):
        try:
            devices.append(read_device(index))
        except pynvml.NVMLError as exc:
            errors.append(f"GPU {index} did not answer: {type(exc).__name__}")
    held = {device.index: memory for device, memory in server_memory(server, devices)}
    gpus = [GpuInfo(d.index, d.uuid, d.name, d.used, d.total, held.get(d.index), d.utilization, *recent_busy(d))
            for d in devices]
    return GpuSection(True, "; ".join(errors), gpus)


def recent_busy(device: Device) -> tuple[float | None, float]:
    """Mean utilization over the samples NVML still buffers (`nvmlDeviceGetSamples` from time 0: up to a few
    minutes at its 1/6 to 1 s period) and their span, integrated as the exporter's sampler does."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.index))
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    except pynvml.NVMLError:
        return None, 0.0  # not supported (MIG, old GPUs), or no sample yet
    stamps = sorted((int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples)
    span = (stamps[-1][0] - stamps[0][0]) / 1e6 if stamps else 0.0
    if span <= 0:
        return None, 0.0
    integrator = BusyIntegrator()
    integrator.add_samples(stamps)
    return integrator.busy_seconds / span, span


def processes_since(server: Server, earlier: Mapping[tuple[int, float], float], procfs: str) -> list[ProcessInfo]:
    """The tree now, with the CPU seconds each process used since `earlier` (its totals by pid and start time)."""
    out = []
    for s in server.tree():
        used = s.cpu_user + s.cpu_system - earlier.get((s.pid, s.create_time), s.cpu_user + s.cpu_system)
        out.append(ProcessInfo(s.pid, s.role, s.state, max(0.0, used), _wchan(procfs, s.pid) if s.state == "D" else ""))
    return out


def _wchan(procfs: str, pid: int) -> str:
    try:
        return Path(procfs, str(pid), "wchan").read_text().strip() or "?"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _port(server: Server, config: Config) -> PortInfo:
    enter_netns = config.collector("probe", ProbeSettings).enter_netns
    probes = []
    launch = server.launch
    for target in launch.probes:
        result, why = probe_target(target, server, config.paths.procfs, enter_netns)
        if result is None:
            probes.append(ProbeInfo(target.probe.url, None, 0, why, 0.0))
            continue
        if result.success:
            server.interpreter.probe_succeeded(time.time())
        probes.append(ProbeInfo(target.probe.url, result.success, result.status, result.reason or "",
                                result.duration))
    listening = None if launch.listening is None else bool(launch.listening)
    return PortInfo(launch.port, listening, list(launch.listening or ()), probes)


def _engine(server: Server, config: Config, before: tuple[str, float, float] | None) -> EngineInfo:
    timeout = config.collector("engine_metrics", EngineMetricsSettings).timeout
    page = read_page(server, timeout)
    if page.figures is not None:
        running, waiting, tokens = page.figures
        made = tokens - before[1] if before is not None and before[0] == "metrics" else None
        return EngineInfo("metrics", running, waiting, tokens, made, "")
    figures = server.interpreter.figures()
    if figures is None:
        return EngineInfo("", None, None, None, None, page.error)
    # From stats lines: measured only when a new line came in the window (an idle engine prints none).
    fresh = before is not None and before[0] == "log" and figures.at > before[2]
    made = figures.tokens - before[1] if fresh and before is not None else None
    return EngineInfo("log", figures.running, figures.waiting, figures.tokens, made, page.error)


# -- stacks ------------------------------------------------------------------------------------------------------
def pyspy_binary() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"  # a venv's bin, not on PATH
    return str(beside) if os.access(beside, os.X_OK) else None


def dump(pid: int, binary: str | None) -> tuple[list[ThreadStack], str]:
    """The Python threads of `pid` from `py-spy dump`, or why there are none."""
    if binary is None:
        return [], "py-spy is not installed"
    try:
        out = subprocess.run([binary, "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=PYSPY_TIMEOUT, errors="replace")
    except subprocess.TimeoutExpired:
        return [], f"py-spy timed out after {PYSPY_TIMEOUT:.0f}s"
    except OSError as exc:
        return [], f"py-spy could not run: {exc.strerror or exc}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return [], "py-spy failed: " + (lines[-1] if lines else f"exit {out.returncode}")
    return parse_dump(out.stdout), ""


def parse_dump(text: str) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        thread = THREAD_LINE.match(line)
        if thread:
            threads.append(ThreadStack(printable(thread.group(3)), thread.group(2), []))
            continue
        frame = FRAME_LINE.match(line)
        if frame and threads:
            function = frame.group(1)
            threads[-1].frames.append(Frame(function, frame.group(2), bool(WAIT_FRAME.search(function))))
    return threads


def stacks(processes: list[ProcessInfo]) -> list[StackGroup]:
    binary = pyspy_binary()
    live = [p for p in processes if p.state != "Z"]
    with ThreadPoolExecutor(max_workers=min(16, len(live) or 1)) as pool:
        dumps = list(pool.map(lambda p: dump(p.pid, binary), live))
    groups: dict[str, StackGroup] = {}
    for proc, (threads, error) in zip(live, dumps, strict=True):
        # By thread names and frames: a rank caught `active` for a moment still joins its idle peers.
        key = json.dumps([[t.name, [dataclasses.astuple(f) for f in t.frames]] for t in threads]) + error
        group = groups.setdefault(key, StackGroup([], [], threads, error))
        group.roles.append(proc.role)
        group.pids.append(proc.pid)
    return list(groups.values())


def wait_frame(group: StackGroup) -> str | None:
    """The innermost waiting frame of a group's main thread (else its first thread)."""
    threads = sorted(group.threads, key=lambda t: t.name != "MainThread")
    for thread in threads[:1]:
        for frame in thread.frames:
            if frame.wait:
                return frame.function
    return None


# -- verdict -----------------------------------------------------------------------------------------------------
def verdict(report: ServerReport, memory_threshold: float, log_stale: float) -> Verdict:
    """The alert rules' logic on one look at the server."""
    phase = report.phase
    for check in (_failed, _down):
        found = check(report)
        if found is not None:
            return found
    held = [g.server_memory_bytes for g in report.gpu.gpus if g.server_memory_bytes is not None]
    # Now, and over the recent samples where NVML has them: the rules' 5-minute idle window, as far as one look goes.
    utilization = [u for g in report.gpu.gpus if g.server_memory_bytes is not None
                   for u in (g.utilization, g.busy_ratio) if u is not None]
    idle = not utilization or max(utilization) < IDLE_RATIO
    quiet = phase.quiet_seconds > log_stale
    probes = [p.success for p in report.port.probes if p.success is not None]
    not_serving = phase.phase != "serving" or (bool(probes) and not all(probes)) or report.port.listening is False
    if held and max(held) > memory_threshold and idle and quiet and not_serving:
        return Verdict("stalled", f"loaded but idle for {_duration(phase.quiet_seconds)} in {phase.phase}; "
                                  + _evidence(report))
    if phase.phase in STARTUP and quiet and idle:
        return Verdict("stalled", f"startup stuck in {phase.phase}: no log progress for "
                                  f"{_duration(phase.quiet_seconds)} and no GPU activity; " + _evidence(report))
    return _serving(report) or _starting(report, log_stale)


def _failed(report: ServerReport) -> Verdict | None:
    if report.phase.phase != "failed":
        return None
    events = ", ".join(f"{k} {v}" for k, v in report.log.events.items()) or "no notable line"
    last = f"; last line: {report.log.lines[-1]}" if report.log.lines else ""
    return Verdict("failed", f"failed {_duration(report.phase.seconds)} ago ({events}){last}")


def _down(report: ServerReport) -> Verdict | None:
    if report.phase.phase != "stopped":
        return None
    return Verdict("down", f"main process gone for {_duration(report.phase.seconds)}")


def _serving(report: ServerReport) -> Verdict | None:
    if report.phase.phase != "serving":
        return None
    failing = [p for p in report.port.probes if p.success is False]
    if failing:
        return Verdict("stalled", f"serving, but the health probe fails ({failing[0].reason}); " + _evidence(report))
    figures = report.engine_figures
    held = (figures.running or 0) + (figures.waiting or 0)
    if held > 0 and figures.tokens_in_window == 0:
        return Verdict("stalled", f"serving, holds {held:.0f} requests ({figures.running:.0f} running, "
                                  f"{figures.waiting:.0f} waiting) and generated no token in the "
                                  f"{report.window_seconds:.0f}s window (from its {figures.source}); "
                                  + _evidence(report))
    work = f"{held:.0f} requests in hand" if figures.source else "no engine figures"
    return Verdict("healthy", f"serving for {_duration(report.phase.seconds)}, probe passing, {work}")


def _starting(report: ServerReport, log_stale: float) -> Verdict:
    phase = report.phase
    return Verdict("starting", f"{phase.phase} for {_duration(phase.seconds)}, last log progress "
                               f"{_duration(phase.quiet_seconds)} ago (stall threshold {_duration(log_stale)})")


def _evidence(report: ServerReport) -> str:
    port = report.port
    if port.listening is None:
        parts = ["port unknown"]
    else:
        parts = ["port listening" if port.listening else "port never opened"]
    waits = _waits(report)
    if waits:
        parts.append(waits)
    events = [f"{k} x{v}" for k, v in report.log.events.items() if k != "server_restart"]
    if events:
        parts.append("log events: " + ", ".join(events))
    return "; ".join(parts)


def _waits(report: ServerReport) -> str:
    """"all 8 scheduler_TP* waiting in `recv`": the frame most processes wait in, and which processes."""
    waiting: dict[str, list[str]] = {}
    for group in report.stacks:
        frame = wait_frame(group)
        if frame is not None:
            waiting.setdefault(frame, []).extend(group.roles)
    if not waiting:
        return ""
    frame, roles = max(waiting.items(), key=lambda item: len(item[1]))
    total = sum(1 for p in report.processes if p.state != "Z")
    who = f"all {total} processes" if len(roles) == total else f"{len(roles)} of {total} processes ({_roles(roles)})"
    return f"{who} waiting in `{frame}`"


def _roles(roles: list[str]) -> str:
    """`scheduler_TP0..7, detokenizer`: ranks of one role folded."""
    ranked: dict[str, list[int]] = {}
    plain = []
    for role in roles:
        match = re.fullmatch(r"(.*?)(\d+)", role)
        if match and match.group(1):
            ranked.setdefault(match.group(1), []).append(int(match.group(2)))
        else:
            plain.append(role)
    folded = [f"{stem}{min(n)}..{max(n)}" if len(n) > 1 else f"{stem}{n[0]}" for stem, n in ranked.items()]
    return ", ".join(folded + plain)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- rendering ---------------------------------------------------------------------------------------------------
def render_json(report: Report) -> str:
    return json.dumps(dataclasses.asdict(report), indent=2)


def render_text(report: Report) -> str:
    if not report.servers:
        return "no inference server is watched on this node\n"
    return "\n".join(_server_text(s) for s in report.servers)


def _server_text(s: ServerReport) -> str:
    return "\n\n".join([_head(s), *body_sections(s, evidence=True)]) + "\n"


def body_sections(s: ServerReport, evidence: bool, probed: str = "probe now") -> list[str]:
    """The report below its head; without `evidence`, no stack and no log line (they can hold prompts).
    `probed` names the probe results: made now (diagnose), or the background prober's last (status page)."""
    out = [_gpu_text(s.gpu), _process_text(s)]
    if evidence:
        out.append(_stack_text(s.stacks))
    out += [_port_text(s.port, probed), _engine_text(s.engine_figures), _log_text(s.log, evidence)]
    return out


def _head(s: ServerReport) -> str:
    return "\n".join([f"=== {s.name} ===", f"VERDICT: {s.verdict.status.upper()}: {s.verdict.text}",
                      *describe(s)])


def describe(s: ServerReport) -> list[str]:
    """Identity, phase, timeline and shard progress: the head's lines under the verdict."""
    i, p = s.identity, s.phase
    where = ", ".join(f"{k} {v}" for k, v in (("namespace", i.namespace), ("pod", i.pod), ("container", i.container),
                                               ("unit", i.unit)) if v)
    shards = f"{p.shards_loaded}/{p.shards_expected}" if p.shards_expected else "none seen"
    return [
        f"engine {i.engine}, model {i.model or '?'}, TP {i.tensor_parallel or '?'}, runtime {i.runtime}"
        + (f" ({where})" if where else "") + f", main pid {i.pid}, port {i.port}",
        f"phase {p.phase} for {_duration(p.seconds)}; last log progress {_duration(p.quiet_seconds)} ago",
        f"timeline: {' -> '.join(p.timeline)}  ({p.timeline_note})",
        f"weight shards: {shards}",
    ]


def _gpu_text(g: GpuSection) -> str:
    if not g.nvml_up:
        return f"GPUs: {g.error}"
    rows = [f"  GPU {d.index} {d.name}: server holds "
            + (f"{d.server_memory_bytes / 1e9:.1f} GB" if d.server_memory_bytes is not None else "nothing")
            + f", used {d.memory_used_bytes / 1e9:.1f}/{d.memory_total_bytes / 1e9:.1f} GB, utilization "
            + (f"{d.utilization:.0%}" if d.utilization is not None else "n/a")
            + (f", busy {d.busy_ratio:.0%} over the last {d.busy_window_seconds:.0f} s" if d.busy_ratio is not None
               else "") for d in g.gpus]
    return "\n".join(["GPUs (utilization now; busy: over NVML's recent samples):", *rows]
                     + ([f"  {g.error}"] if g.error else []))


def _process_text(s: ServerReport) -> str:
    rows = [f"  {p.pid:>8} {p.state} {p.cpu_seconds:6.2f}s  {p.role}" + (f"  wchan {p.wchan}" if p.wchan else "")
            for p in s.processes]
    return "\n".join([f"processes (CPU seconds over a {s.window_seconds:.0f} s window):", *rows])


def _stack_text(groups: list[StackGroup]) -> str:
    out = ["Python stacks (py-spy dump; '<-- WAIT' marks frames that wait):"]
    for group in groups:
        out.append(f"  [{_roles(group.roles)}] pids {', '.join(map(str, group.pids))}")
        if group.error:
            out.append(f"    {group.error}")
        for thread in group.threads:
            out.append(f"    thread {thread.name} ({thread.status})")
            out += [f"      {f.function} ({f.location})" + ("  <-- WAIT" if f.wait else "") for f in thread.frames]
    return "\n".join(out)


def _port_text(port: PortInfo, probed: str) -> str:
    listening = {None: "unknown", True: f"listening on {', '.join(port.addresses)}", False: "not listening"}
    rows = [f"port {port.port}: {listening[port.listening]}"]
    for p in port.probes:
        result = ("not made: " + p.reason if p.success is None else
                  f"ok (HTTP {p.status}, {p.duration_seconds * 1000:.0f} ms)" if p.success else
                  f"failed: {p.reason}" + (f" (HTTP {p.status})" if p.status else ""))
        rows.append(f"  {probed} {p.url}: {result}")
    return "\n".join(rows)


def _engine_text(e: EngineInfo) -> str:
    if not e.source:
        return "engine figures: none (no /metrics page answered, no stats line seen)" + (
            f": {e.error}" if e.error else "")
    made = "not measured" if e.tokens_in_window is None else f"{e.tokens_in_window:.0f}"
    return (f"engine figures (from its {e.source}): running {e.running:.0f}, waiting {e.waiting:.0f}, "
            f"tokens {e.tokens:.0f} (in the window: {made})")


def _log_text(log: LogInfo, evidence: bool) -> str:
    events = ", ".join(f"{k} {v}" for k, v in log.events.items()) or "none"
    head = f"log {', '.join(log.sources) or '(none found)'}; events of this launch: {events}"
    if not evidence:
        return head
    return "\n".join([head, f"last {len(log.lines)} lines:", *(f"  | {line}" for line in log.lines)])
