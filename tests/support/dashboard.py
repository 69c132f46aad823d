"""The shipped Grafana dashboard's queries."""

from __future__ import annotations

import json
import re

from support.paths import ROOT

DASHBOARD = ROOT / "grafana" / "stallwatch.json"


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana's variables filled in as Grafana would."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "15s")
            out.append((panel["title"], re.sub(r"\$(instance|server)\b", ".*", expr)))
    return out


def annotation_queries() -> list[tuple[str, str]]:
    """(annotation name, PromQL) for every annotation, with Grafana's variables filled in."""
    return [(a["name"], re.sub(r"\$(instance|server)\b", ".*", a["expr"]))
            for a in json.loads(DASHBOARD.read_text())["annotations"]["list"]]
