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


def test_the_drop_list_holds_every_family_the_rules_do_not_read_and_none_they_do() -> None:
    """README "Series budget": what the rules read stays; every other default family is in its drop list (detail
    families are off by default), and the example Prometheus config carries the same list."""
    readme = (ROOT / "README.md").read_text().split("### Series budget", 1)[1].split("\n## ", 1)[0]
    regexes = re.findall(r"^\s+regex: (stallwatch_\S+)$", readme, re.MULTILINE)
    assert regexes, "no drop list in README \"Series budget\""
    dropped = {PREFIX + name for name in CATALOG if any(re.fullmatch(rx, PREFIX + name) for rx in regexes)}
    rules = set(re.findall(r"stallwatch_[a-z0-9_]+", (ROOT / "rules" / "stallwatch.rules.yml").read_text()))
    assert dropped & rules == set(), "the drop list drops what the rules read"
    default = {PREFIX + name for name, family in CATALOG.items() if not family.detail}
    assert default - rules - dropped == set(), "default families the rules do not read, missing from the drop list"
    example = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert re.findall(r"^\s+#\s+regex: (stallwatch_\S+)$", example, re.MULTILINE) == regexes
