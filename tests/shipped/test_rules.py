"""The alert rules as shipped, checked and unit-tested with the real promtool."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from stallwatch.signals.xid import RECENT_SECONDS, RECOVERY_NOT_FAULTS, XIDS
from support.harness import require
from support.paths import ROOT

RULES = ROOT / "rules" / "stallwatch.rules.yml"


RULE_TESTS = ROOT / "rules" / "tests" / "stallwatch.rules.test.yml"
# Every file of rule tests (the PD group's are in a file of their own).
RULE_TEST_FILES = sorted((ROOT / "rules" / "tests").glob("*.rules.test.yml"))


RUNBOOK = ROOT / "docs" / "runbook.md"


def alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def firing_labels() -> dict[str, list[set[str]]]:
    """Each alert's label names in the firing expectations of the rule tests (promtool compares them exactly)."""
    found: dict[str, list[set[str]]] = {}
    for test in (t for path in RULE_TEST_FILES for t in yaml.safe_load(path.read_text())["tests"]):
        for case in test.get("alert_rule_test", []):
            for expected in case["exp_alerts"]:
                found.setdefault(case["alertname"], []).append({"alertname", *expected.get("exp_labels", {})})
    return found


def rule_blocks() -> list[list[str]]:
    """The rules file's lines, one list per rule (from its first line to the next rule's), with the comment
    lines just above a rule counted as its own."""
    blocks: list[list[str]] = []
    pending: list[str] = []
    for line in RULES.read_text().splitlines():
        if line.strip().startswith("#"):
            pending.append(line)
            continue
        if re.match(r"\s+- (record|alert):", line):
            blocks.append(pending)
        elif blocks:
            blocks[-1].extend(pending)
        pending = []
        if blocks:
            blocks[-1].append(line)
    return blocks


@pytest.mark.process
def test_promtool_check_rules() -> None:
    result = subprocess.run([require("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_promtool_test_rules() -> None:
    result = subprocess.run([require("promtool"), "test", "rules", *(path.name for path in RULE_TEST_FILES)],
                            cwd=RULE_TESTS.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_silent_on_missing_data() -> None:
    tests = [t for path in RULE_TEST_FILES for t in yaml.safe_load(path.read_text())["tests"]]
    fires = {c["alertname"] for t in tests for c in t.get("alert_rule_test", []) if c["exp_alerts"]}
    missing = next(t for t in tests if t["name"] == "missing data does not page")
    silent = {c["alertname"] for c in missing["alert_rule_test"] if not c["exp_alerts"]}
    names = {a["alert"] for a in alerts()}
    assert names - fires == set(), "alerts without a test that fires"
    assert names - silent == set(), "alerts without a missing-data case"


def test_gpu_fault_rules_alert_on_the_xids_and_recovery_actions_the_reports_name() -> None:
    """The Xid sets, windows and recovery actions of the GPU fault rules are those of signals/xid.py, which the
    verdict and the reports use."""
    rules = {a["alert"]: a["expr"] for a in alerts()}
    for name, kind in (("InferenceServerGpuFault", "fault"), ("InferenceServerGpuApplicationFault", "application")):
        sets = set(re.findall(r'stallwatch_server_gpu_xid_last_timestamp_seconds\{xid=~"([\d|]+)"\}\s*<\s*(\d+)',
                              rules[name]))
        assert sets == {("|".join(str(x) for x in sorted(XIDS) if XIDS[x].kind == kind),
                         f"{RECENT_SECONDS[kind]:.0f}")}, name
    not_faults = re.search(r"stallwatch_server_gpu_recovery_action > 0((?: != \d+)*)\n",
                           rules["InferenceServerGpuFault"])
    assert not_faults is not None
    assert {0, *map(int, re.findall(r"\d+", not_faults.group(1)))} == RECOVERY_NOT_FAULTS


def test_alert_style() -> None:
    anchors = set(re.findall(r"^## (\w+)", RUNBOOK.read_text(), re.MULTILINE))
    tested = firing_labels()
    for alert in alerts():
        name = alert["alert"]
        assert re.match(r"(InferenceServer|InferenceDeployment|InferencePD|Stallwatch)[A-Z]\w+$", name), name
        assert alert["labels"]["severity"] in ("critical", "warning")
        notes = alert["annotations"]
        assert notes["summary"].endswith("."), name
        # A template that names a label the alert does not carry renders `<no value>`.
        used = {label for text in notes.values() for label in re.findall(r"\$labels\.(\w+)", text)}
        for labels in tested.get(name, []):
            assert used <= labels, f"{name}: its annotations name {sorted(used - labels)}, which it does not carry"
        if name.startswith(("InferenceDeployment", "InferencePD")):
            # One alert per deployment or PD group (labels: its key) or per member of one (its instance kept): it names
            # the deployment or group, and the instance wherever its expression keeps it.
            key = "$labels.deployment" if name.startswith("InferenceDeployment") else "$labels.pd_group"
            assert key in notes["description"], name
            assert tested.get(name), f"{name}: no test that fires"
            if all("instance" in labels for labels in tested[name]):
                assert "$labels.instance" in notes["description"], name
        else:
            assert "$labels.instance" in notes["description"], name
        if name.startswith("InferenceServer"):
            assert set(notes) == {"summary", "description", "runbook_url", "status_url"}, name
            assert "$labels.server" in notes["description"], name
            # The exporter's page for the server, on the host:port Prometheus scrapes. The name goes in the query,
            # where `urlquery` is the escaping: a path loses a name that is a dot segment and keeps `+` as a plus.
            status_url = "http://{{ $labels.instance }}/servers/?name={{ $labels.server | urlquery }}"
            assert notes["status_url"] == status_url, name
        else:
            assert set(notes) == {"summary", "description", "runbook_url"}, name
        assert notes["runbook_url"].endswith("docs/runbook.md#" + name.lower()), name
        assert name in anchors, f"no runbook section for {name}"


@pytest.mark.process
def test_example_prometheus_and_alertmanager_configs() -> None:
    deploy = ROOT / "deploy" / "prometheus"
    result = subprocess.run([require("promtool"), "check", "config", str(deploy / "prometheus.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run([require("amtool"), "check-config", str(deploy / "alertmanager.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_window_says_why() -> None:
    """Each `for:` has a comment right above it; each range or offset in an expression is named in a comment
    of its rule (the windows decide how fast a page comes and what stays silent)."""
    blocks = rule_blocks()
    assert len(blocks) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    for block in blocks:
        name = next(line for line in block if not line.strip().startswith("#")).split(":", 1)[1].strip()
        expr = "\n".join(line for line in block[:next((i for i, line in enumerate(block)
                                                       if re.match(r"\s+(labels|annotations):", line)), len(block))]
                         if not line.strip().startswith("#"))
        comments = "\n".join(line for line in block if line.strip().startswith("#"))
        for i, line in enumerate(block):
            if re.match(r"\s+for:", line):
                assert block[i - 1].strip().startswith("#"), f"{name}: say why its `for` is {line.strip()}"
        for window in set(re.findall(r"\[(\d+[smh])\]|offset (\d+[smh])", expr)):
            duration = window[0] or window[1]
            assert re.search(rf"\b{duration}\b", comments), f"{name}: no comment says why its window is {duration}"


def test_every_group_fits_a_remote_rulers_limits() -> None:
    """Grafana Mimir's ruler refuses a group of more than 20 rules (`ruler_max_rules_per_rule_group`) and a tenant of
    more than 70 groups (README "Past one Prometheus")."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert len(groups) <= 70
    assert {g["name"]: len(g["rules"]) for g in groups if len(g["rules"]) > 20} == {}
