"""The metric table in the docs against the catalog."""

from __future__ import annotations

import re

from stallwatch.collectors.catalog import CATALOG, PREFIX
from support.docs import documented


def test_every_family_is_documented_and_every_documented_family_exists() -> None:
    emitted = {PREFIX + name for name in CATALOG}
    assert documented() - emitted == set(), "documented in README but not in stallwatch.collectors.catalog.CATALOG"
    assert emitted - documented() == set(), "in stallwatch.collectors.catalog.CATALOG but not documented in README"


def test_catalog_follows_naming_conventions() -> None:
    for name, family in CATALOG.items():
        assert family.help.endswith("."), name
        assert name.endswith("_total") == (family.kind == "counter"), name
        assert not re.search(r"_(percent|ms|mib|mb)$", name), name
