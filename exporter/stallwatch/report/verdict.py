"""The verdict on a server: the alert rules' logic (`rules/stallwatch.rules.yml`) on what one look can see.

GPU utilization now, and over NVML's buffered samples, stands for the rules' 5-minute idle window; the token
counter over the report's window for their 2-minute one. Its cases are tabled beside the rules' own in
`tests/unit/report/test_verdict.py`.
"""

from __future__ import annotations

from stallwatch.report.model import GpuInfo, ServerReport, Verdict
from stallwatch.report.render import duration, fold_roles, xid_text
from stallwatch.report.stacks import wait_frame
from stallwatch.signals.xid import RECENT_SECONDS, RECOVERY_ACTIONS, RECOVERY_NOT_FAULTS

IDLE_RATIO = 0.005  # the rules' idle threshold on the busiest GPU's utilization
SPIN_BUSY, SPIN_POWER = 0.95, 0.3  # the rules' busy-wait: this busy at under this share of the power limit
STARTUP = ("launching", "loading_weights", "allocating_memory", "capturing_graphs", "warming_up")


def verdict(report: ServerReport, memory_threshold: float, log_stale: float) -> Verdict:
    """The alert rules' logic on one look at the server."""
    phase = report.phase
    for check in (_gpu_fault, _failed, _gone, _lost_ranks, _frozen):
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
    # A worker node's silence, closed port, constant or absent probe and idle GPUs say nothing: its head judges.
    not_serving = not_serving and not _worker(report)
    if held and max(held) > memory_threshold and idle and quiet and not_serving:
        return Verdict("stalled", f"loaded but idle for {duration(phase.quiet_seconds)} in {phase.phase}; "
                                  + _evidence(report))
    spinning = [g for g in report.gpu.gpus if g.server_memory_bytes and _spins(g)]
    if spinning and quiet and not_serving:
        power = ", ".join(f"GPU {g.index} {g.utilization:.0%} at {g.power_watts:.0f} W of {g.power_limit_watts:.0f} W"
                          for g in spinning)
        return Verdict("stalled", f"busy-waiting in a collective for {duration(phase.quiet_seconds)} in "
                                  f"{phase.phase} ({power}): a peer rank is dead or slow; " + _evidence(report))
    if phase.phase in STARTUP and quiet and idle:
        return Verdict("stalled", f"startup stuck in {phase.phase}: no log progress for "
                                  f"{duration(phase.quiet_seconds)} and no GPU activity; " + _evidence(report))
    return _serving(report) or _starting(report, log_stale)


def _spins(g: GpuInfo) -> bool:
    """Busy now and over the recent samples at under SPIN_POWER of its limit: stallwatch:server_gpu_spinning_ratio:max
    as one look sees it (the power now for the rules' highest over 5 minutes)."""
    return (g.utilization is not None and g.utilization >= SPIN_BUSY
            and (g.busy_ratio is None or g.busy_ratio >= SPIN_BUSY)
            and g.power_watts is not None and bool(g.power_limit_watts)
            and g.power_watts < SPIN_POWER * (g.power_limit_watts or 0.0))


def _gpu_fault(report: ServerReport) -> Verdict | None:
    """InferenceServerGpuFault: a recent Xid of the fault class, or a recovery action that asks for a reset or a
    reboot, on a GPU the server holds memory on."""
    for g in report.gpu.gpus:
        if not g.server_memory_bytes:
            continue
        recent = [x for x in g.xids if x.kind == "fault" and x.seconds_ago < RECENT_SECONDS["fault"]]
        action = g.recovery_action
        if recent or (action is not None and action not in RECOVERY_NOT_FAULTS):
            said = f"GPU {g.index} ({g.uuid}) reported {xid_text(recent[0])}" if recent else f"GPU {g.index} ({g.uuid})"
            if not g.answering:
                said += ", and it does not answer NVML now"
            if action:
                said += f", the driver asks for: {RECOVERY_ACTIONS.get(action, str(action))}"
            return Verdict("failed", said + "; drain the server, then reset the GPU or reboot: it will not recover "
                                            "by itself")
    return None


def _failed(report: ServerReport) -> Verdict | None:
    if report.phase.phase != "failed":
        return None
    events = ", ".join(f"{k} {v}" for k, v in report.log.events.items()) or "no notable line"
    last = f"; last line: {report.log.lines[-1]}" if report.log.lines else ""
    return Verdict("failed", f"failed {duration(report.phase.seconds)} ago ({events}){last}")


def _gone(report: ServerReport) -> Verdict | None:
    """InferenceServerDown: the main process gone, unless a discovered server's launch logged that it was asked to
    stop (a stop is not an outage; a configured server should run, so its stop is still one)."""
    phase = report.phase
    if phase.phase != "stopped":
        return None
    gone = f"main process gone for {duration(phase.seconds)}"
    last = phase.timeline[-2] if len(phase.timeline) > 1 else ""
    if last:
        gone += f", last in {last}"
    events = ", ".join(f"{k} {v}" for k, v in report.log.events.items() if k != "server_restart")
    gone += f"; log events: {events}" if events else ""
    if phase.stop_requested and not report.identity.configured:
        return Verdict("stopped", f"stopped on request: its engine logged the stop, then its {gone}")
    if phase.stop_requested:
        return Verdict("down", f"{gone}; it logged a stop request, but it is configured to run")
    return Verdict("down", f"{gone}, without a stop request in its log")


def _frozen(report: ServerReport) -> Verdict | None:
    """The main process stopped by a signal (state T: SIGSTOP, SIGTSTP, or t: a tracer holds it) and no probe
    passing: it runs no code, whatever phase its log reached, so it is no startup."""
    main = next((p for p in report.processes if p.role == "main"), None)
    if main is None or main.state not in ("T", "t"):
        return None
    probes = [p for p in report.port.probes if p.success is not None]
    if any(p.success for p in probes):
        return None
    failing = f"; the probe fails ({probes[0].reason})" if probes else ""
    return Verdict("stalled", f"main process {main.pid} is stopped (state {main.state}: SIGSTOP or a debugger holds "
                              f"it) in {report.phase.phase}{failing}; it runs nothing until SIGCONT; "
                              + _evidence(report))


def _worker(report: ServerReport) -> bool:
    member = report.identity.deployment
    return member is not None and member.role == "worker"


def _lost_ranks(report: ServerReport) -> Verdict | None:
    """InferenceDeploymentMemberLost as one worker sees it: fewer rank processes than its launch had."""
    member = report.identity.deployment
    if not _worker(report) or member is None or member.ranks is None or not member.ranks_started:
        return None
    if member.ranks >= member.ranks_started:
        return None
    return Verdict("stalled", f"worker node {member.node_rank} of deployment {member.deployment} has "
                              f"{member.ranks} of its {member.ranks_started} rank processes left while its parent "
                              "lives; the deployment cannot serve, whatever this node's /health says")


def _serving(report: ServerReport) -> Verdict | None:
    if report.phase.phase != "serving":
        return None
    member = report.identity.deployment
    if _worker(report) and member is not None:
        return Verdict("healthy", f"worker node {member.node_rank} of {member.nnodes} of deployment "
                                  f"{member.deployment}, ready for {duration(report.phase.seconds)} with "
                                  f"{member.ranks} rank processes; its head's probe and figures judge the deployment")
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
    return Verdict("healthy", f"serving for {duration(report.phase.seconds)}, probe passing, {work}")


def _starting(report: ServerReport, log_stale: float) -> Verdict:
    phase = report.phase
    return Verdict("starting", f"{phase.phase} for {duration(phase.seconds)}, last log progress "
                               f"{duration(phase.quiet_seconds)} ago (stall threshold {duration(log_stale)})")


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
    parts.extend(f"GPU {g.index} {xid_text(x)}" for g in report.gpu.gpus if g.server_memory_bytes for x in g.xids)
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
    who = (f"all {total} processes" if len(roles) == total
           else f"{len(roles)} of {total} processes ({fold_roles(roles)})")
    return f"{who} waiting in `{frame}`"
