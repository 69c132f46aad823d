"""The verdict on what one look sees, case by case beside the alert rules' tests."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from stallwatch.report.model import SCHEMA as SCHEMA_PATH
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
from stallwatch.report.verdict import verdict
from stallwatch.signals.xid import xid_class
from support.paths import ROOT

SCHEMA = json.loads(SCHEMA_PATH.read_text())
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
                g.get("recovery"), [_xid(x) for x in g.get("xids", [])])
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
                          deployment, case.get("configured", False)),
        phase=PhaseInfo(case["phase"], time.time() - seconds, seconds, quiet, case.get("timeline", [case["phase"]]),
                        "", 64, 64, case.get("stop_requested", False)),
        gpu=_gpus(case), window_seconds=WINDOW, processes=processes, stacks=stacks,
        port=PortInfo(30000, listening, ["127.0.0.1"] if listening else [], probes), engine_figures=_engine(case),
        log=LogInfo(["/data/sglang.log"], [], dict(case.get("events", {}))), verdict=Verdict("", ""))


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_verdict_on_the_rules_cases(case: dict[str, Any]) -> None:
    found = verdict(report(case), MEMORY_THRESHOLD, LOG_STALE)
    assert found.status == case["expect"], found.text
    for words in case.get("says", []):
        assert words in found.text, found.text


def test_every_case_stands_beside_a_rules_test() -> None:
    rules_tests = yaml.safe_load((ROOT / "rules" / "tests" / "stallwatch.rules.test.yml").read_text())["tests"]
    names = {test["name"] for test in rules_tests}
    assert {case["rules"] for case in CASES} <= names
    assert {case["expect"] for case in CASES} == set(SCHEMA["$defs"]["server"]["properties"]["verdict"]["properties"]
                                                     ["status"]["enum"])
