"""The shipped Grafana dashboard's queries."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator
from typing import Any

from support.paths import ROOT

DASHBOARD = ROOT / "grafana" / "stallwatch.json"
# The row of the panels of deployments over several nodes (grafana/dashboard.py DEPLOYMENT_ROW): without data where
# every server runs on one node.
DEPLOYMENT_ROW = "Deployments"
# The row of the panels of prefill/decode groups (grafana/dashboard.py PD_ROW): without data where no server is one.
PD_ROW = "Prefill/decode groups"
VARIABLES = re.compile(r"\$(instance|server|deployment|pd_group)\b")


def panels() -> Iterator[tuple[str | None, dict[str, Any]]]:
    """(title of its row, panel) for every panel that is not a row, as Grafana places them: an open row holds the
    panels after it up to the next row, a collapsed one its own `panels`; None for those above every row."""
    row = None
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            yield from ((row, inner) for inner in panel.get("panels", []))
        else:
            yield row, panel


def queries(exclude_rows: Collection[str] = (), row: str | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana's variables filled in as Grafana would (All). Without
    the panels of `exclude_rows` (e.g. a single-node test: `queries(exclude_rows={DEPLOYMENT_ROW})`); with `row`,
    only that row's panels."""
    out = []
    for in_row, panel in panels():
        if in_row in exclude_rows or (row is not None and in_row != row):
            continue
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "15s")
            out.append((panel["title"], VARIABLES.sub(".*", expr)))
    return out


def annotation_queries() -> list[tuple[str, str]]:
    """(annotation name, PromQL) for every annotation, with Grafana's variables filled in."""
    return [(a["name"], VARIABLES.sub(".*", a["expr"]))
            for a in json.loads(DASHBOARD.read_text())["annotations"]["list"]]
