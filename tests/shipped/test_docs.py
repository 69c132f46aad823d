"""The metric table in the docs against the catalog; the catalog's detail families against what the rules and the
dashboard read."""

from __future__ import annotations

import re

from stallwatch.collectors.catalog import CATALOG, PREFIX
from support.docs import documented
from support.paths import ROOT


def test_every_family_is_documented_and_every_documented_family_exists() -> None:
    emitted = {PREFIX + name for name in CATALOG}
    assert documented() - emitted == set(), "documented in README but not in stallwatch.collectors.catalog.CATALOG"
    assert emitted - documented() == set(), "in stallwatch.collectors.catalog.CATALOG but not documented in README"


def test_catalog_follows_naming_conventions() -> None:
    for name, family in CATALOG.items():
        assert family.help.endswith("."), name
        assert name.endswith("_total") == (family.kind == "counter"), name
        assert not re.search(r"_(percent|ms|mib|mb)$", name), name


def test_no_shipped_rule_or_panel_reads_a_detail_family() -> None:
    """A detail family is off by default (README "Series budget"): a rule or panel that read one would read nothing."""
    details = {PREFIX + name for name, family in CATALOG.items() if family.detail}
    for path in (ROOT / "rules" / "stallwatch.rules.yml", ROOT / "grafana" / "stallwatch.json"):
        read = set(re.findall(r"stallwatch_[a-z0-9_]+", path.read_text()))
        assert read & details == set(), f"{path.name} reads detail families"
