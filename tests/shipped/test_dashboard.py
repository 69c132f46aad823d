"""The Grafana dashboard as shipped."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.dashboard import DASHBOARD, DEPLOYMENT_ROW, PD_ROW, annotation_queries, panels, queries
from support.harness import require
from support.paths import ROOT


@pytest.mark.process
def test_generated_json_is_current() -> None:
    result = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'grafana'); "
                             "import dashboard; print(dashboard.render(), end='')"],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout == DASHBOARD.read_text(), "run: python grafana/dashboard.py"


def test_importable_as_is_with_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"instance", "server", "deployment"} <= set(variables)
    assert board["schemaVersion"] >= 36 and board["uid"] == "stallwatch"
    for _, panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
    assert "__inputs" not in board  # no import-time datasource prompts, no hard-coded UIDs
    kinds = {p["type"] for p in board["panels"]}
    assert {"state-timeline", "timeseries", "table", "row"} <= kinds
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.process
def test_every_query_parses(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr}
        for i, (_, expr) in enumerate([*queries(), *annotation_queries()])]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([require("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_servers_table_links_each_row_to_its_status_page() -> None:
    panel = next(p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == "Servers")
    [link] = panel["fieldConfig"]["defaults"]["links"]
    assert link["url"] == "http://${__data.fields.instance:raw}/servers/?name=${__data.fields.server:percentencode}"
    rules = (ROOT / "rules" / "stallwatch.rules.yml").read_text()
    assert "status_url: 'http://{{ $labels.instance }}/servers/?name={{ $labels.server | urlquery }}'" in rules


def test_xid_events_are_annotations() -> None:
    [(name, expr)] = annotation_queries()
    assert name == "Xid" and "stallwatch_gpu_xid_last_timestamp_seconds" in expr


def test_deployment_row_holds_the_deployment_panels_and_only_them() -> None:
    """A single-node test leaves out the deployment row (its panels have no data there) and keeps every other panel;
    the row's panels read only members' series, filtered by the `deployment` variable, and no other panel does."""
    rows = [row for row, _ in panels()]
    assert rows[:rows.index(DEPLOYMENT_ROW)] == [None] * rows.index(DEPLOYMENT_ROW)  # the last row, below the rest
    row = queries(row=DEPLOYMENT_ROW)
    assert {title for title, _ in row} == {"Deployment members", "Deployment missing nodes",
                                           "Deployment head: health probe and process",
                                           "Deployment head: generated tokens/s",
                                           "Deployment rank processes: live and started"}
    assert all(re.search(r"stallwatch(?:_|:)deployment_", expr) for _, expr in row), row
    single = queries(exclude_rows={DEPLOYMENT_ROW, PD_ROW})
    assert len(single) + len(row) + len(queries(row=PD_ROW)) == len(queries())
    assert not [title for title, expr in single if "deployment" in expr]
    board = json.loads(DASHBOARD.read_text())
    assert all('deployment=~"$deployment"' in t["expr"]
               for _, p in panels() if p["title"].startswith("Deployment") for t in p["targets"])
    members = next(p for p in board["panels"] if p["title"] == "Deployment members")
    [link] = members["fieldConfig"]["defaults"]["links"]
    assert link["url"] == "http://${__data.fields.instance:raw}/servers/?name=${__data.fields.server:percentencode}"
    # The head judges the deployment: its probe and tokens come from the member whose role is head.
    for title in ("Deployment head: health probe and process", "Deployment head: generated tokens/s"):
        assert all('role="head"' in expr for t, expr in row if t == title and "head_up" not in expr), title


def test_pd_row_holds_the_pd_panels_filtered_by_group() -> None:
    """The prefill/decode group row: below the deployment row, its panels read only PD members' series, each filtered
    by the `pd_group` variable, and no other panel reads them."""
    rows = [row for row, _ in panels()]
    assert rows.index(PD_ROW) > rows.index(DEPLOYMENT_ROW)
    row = queries(row=PD_ROW)
    assert {title for title, _ in row} == {"PD group members", "PD requests pending by stage", "PD KV transfers/s",
                                           "PD router: workers healthy and requests in flight"}
    assert all("stallwatch_pd_member_info" in expr for _, expr in row), row
    assert all('pd_group=~"$pd_group"' in t["expr"] for r, p in panels() if r == PD_ROW for t in p["targets"])
    assert not [title for title, expr in queries(exclude_rows={PD_ROW}) if "pd_member_info" in expr]


def test_firing_alerts_include_the_deployment_alerts() -> None:
    [(_, expr)] = [(t, e) for t, e in queries() if t == "Firing stallwatch alerts"]
    for name in ("InferenceServerLoadedButIdle", "InferenceDeploymentIncomplete", "InferencePDTransferStuck",
                 "StallwatchGpuLost"):
        pattern = re.search(r'alertname=~"([^"]+)"', expr)
        assert pattern and re.fullmatch(pattern.group(1), name), name
