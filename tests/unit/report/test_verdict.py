"""The verdict on what one look sees, case by case beside the alert rules' tests."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from stallwatch.report.model import SCHEMA as SCHEMA_PATH
from stallwatch.report.verdict import verdict
from support.paths import ROOT
from support.reports import CASES, LOG_STALE, MEMORY_THRESHOLD, report

SCHEMA = json.loads(SCHEMA_PATH.read_text())


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
