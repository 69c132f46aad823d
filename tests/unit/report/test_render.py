"""Text the reports print."""

from __future__ import annotations

import dataclasses

import pytest

from stallwatch.report.model import Report
from stallwatch.report.render import fold_roles, parse_json, render_json, render_text
from support.reports import CASES, report


@pytest.mark.parametrize(("roles", "text"), [
    (["scheduler_TP0", "scheduler_TP1", "detokenizer"], "scheduler_TP0..1, detokenizer"),
    (["main"], "main"),
])
def test_roles_fold_ranks(roles: list[str], text: str) -> None:
    assert fold_roles(roles) == text


def test_a_report_read_back_from_its_json_is_the_same_and_says_where_it_came_from() -> None:
    """What `diagnose` reads of a running exporter's report (`/servers/<name>?format=json`)."""
    written = Report("1.0", 1.8e9, [report(case) for case in CASES[:3]])
    read = parse_json(render_json(written))
    assert read == written
    text = render_text(dataclasses.replace(read, from_exporter="http://127.0.0.1:9847"))
    assert text.startswith("(from the running exporter at http://127.0.0.1:9847: ")
    assert "last probe http://127.0.0.1:30000/health" in text and "probe now" not in text


def test_what_is_not_a_report_is_refused() -> None:
    with pytest.raises(ValueError, match="not a report"):
        parse_json(b'{"version": "1", "servers": [{"name": "x"}]}')
