"""The Grafana dashboard: in sync with its generator, importable as is, and every query valid PromQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.dashboard import DASHBOARD, annotation_queries, queries
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
    assert {"instance", "server"} <= set(variables)
    assert board["schemaVersion"] >= 36 and board["uid"] == "stallwatch"
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
    assert "__inputs" not in board  # no import-time datasource prompts, no hard-coded UIDs
    kinds = {p["type"] for p in board["panels"]}
    assert {"state-timeline", "timeseries", "table"} <= kinds


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
    assert link["url"] == "http://${__data.fields.instance:raw}/servers/${__data.fields.server:percentencode}"
    rules = (ROOT / "rules" / "stallwatch.rules.yml").read_text()
    assert "status_url: 'http://{{ $labels.instance }}/servers/{{ $labels.server | urlquery }}'" in rules


def test_xid_events_are_annotations() -> None:
    [(name, expr)] = annotation_queries()
    assert name == "Xid" and "stallwatch_gpu_xid_last_timestamp_seconds" in expr
