"""The PD collector, from looks and page states: members by group and role, pending requests by stage and source,
transfers, and a router's own view of its workers; a server that is no PD member adds nothing."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.core import Metric

from stallwatch.collectors.pd import PdCollector
from stallwatch.discovery.pd import PdPlace
from stallwatch.discovery.server import Launch
from stallwatch.signals.engine_page import PageState
from stallwatch.signals.router_page import RouterView
from support.looks import Looked, look


def _families(servers: list[Looked], states: list[PageState]) -> dict[str, Metric]:
    watcher = SimpleNamespace(servers=lambda: servers)
    pages = SimpleNamespace(states=lambda: states)
    return {f.name: f for f in PdCollector(watcher, pages, node="n").collect()}  # type: ignore[arg-type]


def test_a_decode_and_its_router_as_the_exporter_reads_them() -> None:
    decode = look("d", launch=Launch(host="127.0.0.1", port=30001, pd=PdPlace("decode")))
    router = look("r", engine="sglang_router", launch=Launch(host="0.0.0.0", port=8000, pd=PdPlace(
        "router", "", (("decode", "127.0.0.1", 30001),))))
    plain = look("plain")
    states = [PageState("d"), PageState("r", router=RouterView(True, {"http://127.0.0.1:30001": 1.0}, 3.0)),
              PageState("plain")]
    families = _families([Looked(decode), Looked(router), Looked(plain)], states)
    assert [s.labels for s in families["stallwatch_pd_member_info"].samples] == [
        {"server": "d", "pd_group": "n/r", "pd_role": "decode"},
        {"server": "r", "pd_group": "n/r", "pd_role": "router"}]
    assert [(s.labels["worker"], s.value) for s in families["stallwatch_router_worker_up"].samples] == [
        ("http://127.0.0.1:30001", 1.0)]
    assert [s.value for s in families["stallwatch_router_requests_running"].samples] == [3.0]
    assert [s.value for s in families["stallwatch_router_metrics_up"].samples] == [1.0]
