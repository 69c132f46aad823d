"""Reports (`report.model.ServerReport`) built as values from the verdict cases (`rules/tests/verdict.cases.yml`),
for the tests of what reads them: the verdict, the renderers."""

from __future__ import annotations

import time
from typing import Any

import yaml

from stallwatch.report.model import (
    DeploymentInfo,
    EngineInfo,
    Frame,
    GpuInfo,
    GpuSection,
    Identity,
    LogInfo,
    PhaseInfo,
    PortInfo,
    ProbeInfo,
    ProcessInfo,
    ServerReport,
    StackGroup,
    ThreadStack,
    Verdict,
    XidInfo,
)
from stallwatch.signals.xid import xid_class
from support.paths import ROOT

CASES = yaml.safe_load((ROOT / "rules" / "tests" / "verdict.cases.yml").read_text())


PROBES = {"ok": (True, 200, ""), "refused": (False, 0, "refused"), "timeout": (False, 0, "timeout"),
          "unreachable": (None, 0, "listens on loopback only inside its network namespace")}


MEMORY_THRESHOLD, LOG_STALE, WINDOW = 70e9, 600.0, 60.0


def _gpus(case: dict[str, Any]) -> GpuSection:
    gpus = case.get("gpus", [{}])
    if gpus is None:
        return GpuSection(False, "NVML unavailable (no driver, or no access to it)")
    return GpuSection(True, "", [
        GpuInfo(str(i), f"GPU-{i}", "NVIDIA H100 80GB HBM3", g.get("held", 76e9), 80e9, g.get("held", 76e9),
                g.get("utilization", 0.0), g.get("busy", 0.0), 20.0, g.get("power"), g.get("limit"),
                g.get("recovery"), [_xid(x) for x in g.get("xids", [])], g.get("answering", True))
        for i, g in enumerate(gpus)])


def _xid(seen: dict[str, Any]) -> XidInfo:
    known = xid_class(seen["xid"])
    return XidInfo(seen["xid"], 1, seen["ago"], known.kind, known.meaning)


def _stacks(case: dict[str, Any]) -> tuple[list[ProcessInfo], list[StackGroup]]:
    stack = case.get("stacks")
    if stack is None:
        return [ProcessInfo(100, "main", case.get("main_state", "S"), 0.0, "")], []
    roles = stack["roles"]
    thread = ThreadStack("MainThread", "idle", [Frame(stack["frame"], "engine.py:10", True)])
    processes = [ProcessInfo(100 + i, role, "S", 0.0, "") for i, role in enumerate(roles)]
    return processes, [StackGroup(roles, [p.pid for p in processes], [thread], "")]


def _engine(case: dict[str, Any]) -> EngineInfo:
    engine = case.get("engine")
    if engine is None:
        return EngineInfo("", None, None, None, None, "")
    return EngineInfo("metrics", engine["running"], engine["waiting"], 1e6, engine["made"], "")


def report(case: dict[str, Any]) -> ServerReport:
    quiet = float(case.get("quiet", 0))
    seconds = float(case.get("seconds", quiet))
    probes = [ProbeInfo("http://127.0.0.1:30000/health", *PROBES[p], 0.01) for p in case.get("probes", [])]
    processes, stacks = _stacks(case)
    listening = case.get("listening", True)
    member = case.get("deployment")  # {role, node_rank, nnodes, ranks, ranks_started}: a node of a deployment
    deployment = None if member is None else DeploymentInfo(
        "10.0.0.1:20000", member["role"], member.get("node_rank", 1), member.get("nnodes", 2), member.get("ranks", 8),
        member.get("ranks_started", 8))
    return ServerReport(
        name="kimi",
        identity=Identity("sglang", "moonshotai/Kimi-K2-Instruct", "8", "host", "", "", "", "", 100, 30000,
                          deployment, case.get("configured", False), case.get("pd")),
        phase=PhaseInfo(case["phase"], time.time() - seconds, seconds, quiet, case.get("timeline", [case["phase"]]),
                        "", 64, 64, case.get("stop_requested", False)),
        gpu=_gpus(case), window_seconds=WINDOW, processes=processes, stacks=stacks,
        port=PortInfo(30000, listening, ["127.0.0.1"] if listening else [], probes), engine_figures=_engine(case),
        log=LogInfo(["/data/sglang.log"], [], dict(case.get("events", {}))), verdict=Verdict("", ""))
