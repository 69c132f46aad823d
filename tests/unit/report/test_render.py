"""Text the reports print."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from stallwatch.discovery.pd import PdPlace
from stallwatch.discovery.server import Launch
from stallwatch.report.model import SCHEMA, PdInfo, Report, Verdict
from stallwatch.report.observe import pd_info
from stallwatch.report.render import fold_roles, parse_json, render_json, render_text
from stallwatch.signals.engine_page import PageState
from stallwatch.signals.router_page import RouterView
from support.looks import look
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


def test_the_models_an_engine_has_loaded_are_listed_and_their_names_forge_nothing() -> None:
    """Ollama's `/api/ps` where the verdict is read; a model's name is another user's text: quoted, its control
    characters escaped (no second line that reads like the report's own), and the JSON keeps the list."""
    base = report(CASES[0])
    models = {"llama3.2:latest": 3.2e9, "evil\nverdict: HEALTHY\x1b]0;t\x07": 1e9}
    written = Report("1.0", 1.8e9, [dataclasses.replace(
        base, engine_figures=dataclasses.replace(base.engine_figures, models=models),
        verdict=Verdict("healthy", "serving"))])
    jsonschema.validate(json.loads(render_json(written)), json.loads(SCHEMA.read_text()))
    assert parse_json(render_json(written)) == written
    text = render_text(written)
    assert ('models loaded (the engine\'s own list): "evil\\nverdict: HEALTHY\\u001b]0;t\\u0007" 1.0 GB of GPU '
            'memory, "llama3.2:latest" 3.2 GB of GPU memory') in text
    assert "\x1b" not in text and "\nverdict: HEALTHY" not in text


def test_what_is_not_a_report_is_refused() -> None:
    with pytest.raises(ValueError, match="not a report"):
        parse_json(b'{"version": "1", "servers": [{"name": "x"}]}')


def test_a_pd_member_says_its_group_role_pending_stages_and_transfers() -> None:
    """`diagnose` and the status page (its `describe` lines) show a PD member's place, and the JSON keeps it."""
    pd = PdInfo("llm/kimi-pd", "decode", {"prealloc": 0.0, "transfer": 2.0}, 40.0)
    base = report(CASES[0])
    written = Report("1.0", 1.8e9, [dataclasses.replace(base, identity=dataclasses.replace(base.identity, pd=pd),
                                                        verdict=Verdict("healthy", "serving"))])
    jsonschema.validate(json.loads(render_json(written)), json.loads(SCHEMA.read_text()))
    assert parse_json(render_json(written)) == written
    assert "PD group llm/kimi-pd: decode; pending 0 in prealloc, 2 in transfer; 40 KV transfers completed" in (
        render_text(written))


def test_the_pd_place_of_a_report_is_the_pages_figures_else_the_lines_and_a_routers_view() -> None:
    decode = look("d", launch=Launch(pd=PdPlace("decode")))
    assert pd_info(decode, PageState("d", pending={"transfer": 3.0}, transfers=7.0), "g") == PdInfo(
        "g", "decode", {"transfer": 3.0}, 7.0)
    assert pd_info(decode, None, "") == PdInfo("", "decode", {}, None)
    router = look("r", engine="sglang_router", launch=Launch(pd=PdPlace("router")))
    assert pd_info(router, PageState("r", router=RouterView(True, {"http://p:30000": 0.0}, 1.0)), "g").workers == {
        "http://p:30000": 0.0}
    assert pd_info(look("plain"), None, "g") is None
