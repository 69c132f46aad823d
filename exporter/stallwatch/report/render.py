"""The report as text (`stallwatch diagnose`, the status page's sections) and as JSON."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from typing import Any

from stallwatch.report.model import (
    EngineInfo,
    GpuInfo,
    GpuSection,
    LogInfo,
    PdInfo,
    PortInfo,
    Report,
    ServerReport,
    StackGroup,
    XidInfo,
)
from stallwatch.signals.xid import RECOVERY_ACTIONS
from stallwatch.text import terminal_safe


def render_json(report: Report) -> str:
    return json.dumps(dataclasses.asdict(report), indent=2)


def parse_json(text: str | bytes) -> Report:
    """The report `render_json` wrote (a running exporter's); ValueError when `text` is not one."""
    try:
        return _load(Report, json.loads(text))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a report: {exc!r}") from exc


def _load(kind: Any, data: Any) -> Any:
    """`data` (JSON values) as `kind`: a dataclass of the model, a list or dict of them, `X | None`, or a plain
    value."""
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: _load(hints[f.name], data[f.name]) for f in dataclasses.fields(kind) if f.name in data})
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is types.UnionType:
        return None if data is None else _load(next(a for a in args if a is not type(None)), data)
    if origin is list:
        return [_load(args[0], item) for item in data]
    if origin is dict:
        return {key: _load(args[1], value) for key, value in data.items()}
    return data


def render_text(report: Report) -> str:
    """The report for a terminal: what other processes wrote (argv, paths, titles, lines) cannot drive it."""
    if not report.servers:
        return "no inference server is watched on this node\n"
    probed, note = "probe now", ""
    if report.from_exporter:
        probed = "last probe"
        note = (f"(from the running exporter at {report.from_exporter}: what it keeps of a server whose process this "
                "look cannot see; its prober's last results, CPU and tokens over its last minute, log lines only "
                "with its web.show_evidence)\n")
    return terminal_safe(note + "\n".join(_server_text(s, probed) for s in report.servers))


def _server_text(s: ServerReport, probed: str) -> str:
    return "\n\n".join([_head(s), *body_sections(s, evidence=True, probed=probed)]) + "\n"


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
    d = i.deployment
    shards = f"{p.shards_loaded}/{p.shards_expected}" if p.shards_expected else (
        "none on a worker node (its head shows them)" if d is not None and d.role == "worker" else "none seen")
    member = [] if d is None else [
        f"deployment {d.deployment}: node {d.node_rank} of {d.nnodes} ({d.role})"
        + (f", {d.ranks} of {d.ranks_started} rank processes live" if d.ranks is not None else "")]
    member += [] if i.pd is None else [pd_text(i.pd)]
    return [
        f"engine {i.engine}, model {i.model or '?'}, TP {i.tensor_parallel or '?'}, runtime {i.runtime}"
        + (f" ({where})" if where else "") + f", main pid {i.pid}, port {i.port}", *member,
        f"phase {p.phase} for {duration(p.seconds)}; last log progress {duration(p.quiet_seconds)} ago",
        f"timeline: {' -> '.join(p.timeline)}  ({p.timeline_note})",
        f"weight shards: {shards}",
    ]


def pd_text(pd: PdInfo) -> str:
    """"PD group llm/kimi-pd: decode; pending 2 in transfer; 40 KV transfers completed"."""
    parts = [f"PD group {pd.group or '(none named on this node)'}: {pd.role}"]
    if pd.pending:
        parts.append("pending " + ", ".join(f"{count:.0f} in {stage}" for stage, count in pd.pending.items()))
    if pd.transfers is not None:
        parts.append(f"{pd.transfers:.0f} KV transfers completed")
    if pd.workers:
        parts.append("its workers: " + ", ".join(f"{url} {'healthy' if up else 'excluded'}"
                                                  for url, up in pd.workers.items()))
    return "; ".join(parts)


def _gpu_text(g: GpuSection) -> str:
    if not g.nvml_up:
        return f"GPUs: {g.error}"
    rows = [f"  GPU {d.index} {d.name}: " + ("server holds " if d.answering else
                                             "DOES NOT ANSWER NVML; in its last answer the server held ")
            + (f"{d.server_memory_bytes / 1e9:.1f} GB" if d.server_memory_bytes is not None else "nothing")
            + f", used {d.memory_used_bytes / 1e9:.1f}/{d.memory_total_bytes / 1e9:.1f} GB, utilization "
            + (f"{d.utilization:.0%}" if d.utilization is not None else "n/a")
            + (f", busy {d.busy_ratio:.0%} over the last {d.busy_window_seconds:.0f} s" if d.busy_ratio is not None
               else "") + _health_text(d) for d in g.gpus]
    return "\n".join(["GPUs (utilization now; busy: over NVML's recent samples):", *rows]
                     + ([f"  {g.error}"] if g.error else []))


def _health_text(d: GpuInfo) -> str:
    """", 70 W of 700 W, recovery action node reboot; Xid 79 x1 3 min ago (the GPU has fallen off the bus: ...)"."""
    out = ""
    if d.power_watts is not None:
        out += f", {d.power_watts:.0f} W" + (f" of {d.power_limit_watts:.0f} W" if d.power_limit_watts else "")
    if d.recovery_action:
        out += f", recovery action {RECOVERY_ACTIONS.get(d.recovery_action, d.recovery_action)}"
    return out + "".join(f"; {xid_text(x)}" for x in d.xids)


def xid_text(x: XidInfo) -> str:
    """"Xid 109 x1 3 min ago (the GPU stopped processing: reset it); pid 1797828 "pt_main_thread" (scheduler_TP3):
    Ch 00000008, errorString CTX SWITCH TIMEOUT"; "in the kernel log" for one from before the exporter started. The
    name is quoted: the process chose it, commas and all (audit 2026-12-02 #13)."""
    seen = f"x{x.count}" if x.count else "in the kernel log"
    out = f"Xid {x.xid} {seen} {duration(x.seconds_ago)} ago ({x.meaning})"
    if x.pid is not None:
        role = f"({x.role})" if x.role else "(not this server's)"
        out += f"; pid {x.pid} {json.dumps(x.process, ensure_ascii=False)} {role}"
    return out + (f": {x.detail}" if x.detail else "")


def _process_text(s: ServerReport) -> str:
    rows = [f"  {p.pid:>8} {p.state} {p.cpu_seconds:6.2f}s  {p.role}" + (f"  wchan {p.wchan}" if p.wchan else "")
            for p in s.processes]
    return "\n".join([f"processes (CPU seconds over a {s.window_seconds:.0f} s window):", *rows])


def _stack_text(groups: list[StackGroup]) -> str:
    out = ["Python stacks (py-spy dump; '<-- WAIT' marks frames that wait):"]
    for group in groups:
        out.append(f"  [{fold_roles(group.roles)}] pids {', '.join(map(str, group.pids))}")
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
        text = "engine figures: none (no /metrics page answered, no stats line seen)" + (
            f": {e.error}" if e.error else "")
    else:
        made = "not measured" if e.tokens_in_window is None else f"{e.tokens_in_window:.0f}"
        text = (f"engine figures (from its {e.source}): running {e.running:.0f}, waiting {e.waiting:.0f}, "
                f"tokens {e.tokens:.0f} (in the window: {made})" + (f"; its /metrics page: {e.error}" if e.error
                                                                      else ""))
    if e.models is not None:
        loaded = ", ".join(f"{json.dumps(name, ensure_ascii=False)} {size / 1e9:.1f} GB of GPU memory"
                           for name, size in sorted(e.models.items())) or "none"
        text += f"\nmodels loaded (the engine's own list): {loaded}"
    return text


def _log_text(log: LogInfo, evidence: bool) -> str:
    events = ", ".join(f"{k} {v}" for k, v in log.events.items()) or "none"
    head = f"log {', '.join(log.sources) or '(none found)'}; events of this launch: {events}"
    if not evidence:
        return head
    return "\n".join([head, f"last {len(log.lines)} lines:", *(f"  | {line}" for line in log.lines)])


def fold_roles(roles: list[str]) -> str:
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


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
