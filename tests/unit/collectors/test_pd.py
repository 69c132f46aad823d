"""The PD collector, from looks and page states: members by group and role, pending requests by stage and source,
transfers, and a router's own view of its workers; a server that is no PD member adds nothing."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.core import Metric

from stallwatch.collectors.pd import PdCollector
from stallwatch.discovery.pd import PdPlace
from stallwatch.discovery.server import Launch
from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.signals.engine_page import PageState
from stallwatch.signals.router_page import RouterView
from support.looks import Looked, look


def _families(servers: list[Looked], states: list[PageState]) -> dict[str, Metric]:
    watcher = SimpleNamespace(servers=lambda: servers)
    pages = SimpleNamespace(states=lambda: states)
    return {f.name: f for f in PdCollector(watcher, pages, node="n").collect()}  # type: ignore[arg-type]


def test_a_stuck_decode_and_its_router_as_the_exporter_reads_them() -> None:
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.track_pending("decode")
    interpreter.feed(b"[2026-11-20 10:00:00 TP0] Decode batch, #running-req: 0, #token: 0, token usage: 0.00, "
                     b"pre-allocated usage: 0.02, #prealloc-req: 1, #transfer-req: 3, #retracted-req: 0, cuda graph: "
                     b"True, gen throughput (token/s): 0.00, #queue-req: 0\n")
    decode = look("d", launch=Launch(host="127.0.0.1", port=30001, pd=PdPlace("decode")), log=interpreter.snapshot())
    router = look("r", engine="sglang_router", launch=Launch(host="0.0.0.0", port=8000, pd=PdPlace(
        "router", "", (("decode", "127.0.0.1", 30001),))))
    plain = look("plain")
    unlisted = look("both", engine="vllm", launch=Launch(host="0.0.0.0", port=8300, pd=PdPlace("")))  # kv_both
    states = [PageState("d", pending={"prealloc": 1.0, "transfer": 3.0}, transfers=12.0),
              PageState("r", router=RouterView(True, {"http://127.0.0.1:30001": 1.0, "http://127.0.0.1:30005": 0.0},
                                                  3.0)), PageState("plain")]
    families = _families([Looked(decode), Looked(router), Looked(plain), Looked(unlisted)], states)
    assert [s.labels for s in families["stallwatch_pd_member_info"].samples] == [
        {"server": "d", "pd_group": "n/r", "pd_role": "decode"},
        {"server": "r", "pd_group": "n/r", "pd_role": "router"}]
    pending = {(s.labels["source"], s.labels["stage"]): s.value
               for s in families["stallwatch_engine_requests_pending"].samples}
    assert pending == {("log", "prealloc"): 1, ("log", "transfer"): 3, ("metrics", "prealloc"): 1,
                       ("metrics", "transfer"): 3}
    assert [s.value for s in families["stallwatch_engine_kv_transfers"].samples if s.name.endswith("_total")] == [
        12.0]
    assert [(s.labels["worker"], s.labels["role"], s.value) for s in families["stallwatch_router_worker_up"].samples
            ] == [("http://127.0.0.1:30001", "decode", 1.0), ("http://127.0.0.1:30005", "", 0.0)]
    assert [s.value for s in families["stallwatch_router_requests_running"].samples] == [3.0]
    assert [s.value for s in families["stallwatch_router_metrics_up"].samples] == [1.0]
