"""LMDeploy's `lmdeploy serve api_server` (simulated) through the exporter: discovered on its `--server-port`, refused
while it loads, serving with its `lmdeploy:*` figures and its PyTorch engine's process as a role, and its `/health`
503 for a stalled scheduler read into the probe's reason, in LMDeploy's words."""

from __future__ import annotations

import json
import urllib.parse

from support import transcripts
from support.configs import ENGINE_PAGES
from support.harness import Exporter

CONFIG = ENGINE_PAGES

WORK = {"running": 3, "waiting": 1, "throughput": 0.0, "tokens_start": 5000, "interval": 0.3}


def test_lmdeploy_is_discovered_refused_while_loading_and_serves_with_its_figures(exporter, engine) -> None:
    loading = engine("lmdeploy", transcripts.lmdeploy_until_weights(files=8, upto=5), final="stall", tp=1)
    sim = engine("lmdeploy", transcripts.lmdeploy_healthy(), final="serve", tp=1, work=WORK)
    e: Exporter = exporter(config=CONFIG)
    s = e.wait_for(lambda s: s.value("stallwatch_engine_metrics_up", server=sim.name) == 1
                   and s.phase(sim.name) == "serving" and s.phase(loading.name) == "loading_weights"
                   and (s.value("stallwatch_probe_failures_total", server=loading.name, reason="refused") or 0) > 0
                   and s, what="one serving with its figures, one loading and refused")
    assert sim.name == f"lmdeploy-{sim.port}"
    info = [x.labels for x in s.samples("stallwatch_server_info") if x.labels["server"] == sim.name]
    assert info and info[0]["engine"] == "lmdeploy" and info[0]["model"] == "internlm/internlm3-8b-instruct"
    assert s.value("stallwatch_engine_requests_running", server=sim.name, source="metrics") == 3
    assert s.value("stallwatch_engine_requests_waiting", server=sim.name, source="metrics") == 1
    assert s.value("stallwatch_engine_generated_tokens_total", server=sim.name, source="metrics") == 5000
    assert s.value("stallwatch_engine_requests_running", server=sim.name, source="log") == 3  # its stats line
    assert s.value("stallwatch_probe_success", server=sim.name) == 1
    assert s.value("stallwatch_weight_shards_loaded", server=loading.name) == 5
    roles = {x.labels["process"] for x in s.samples("stallwatch_process_threads") if x.labels["server"] == sim.name}
    assert "ZMQMPEngine" in roles, roles
    for server in (sim.name, loading.name):
        assert s.value("stallwatch_log_events_total", server=server, event="fatal") == 0


def test_a_stalled_schedulers_503_is_the_probes_reason_in_its_own_words(exporter, engine) -> None:
    """The scheduler stops ticking with requests in hand: nothing logged, `/health` 503 with its message; the
    counter's reason stays `http_status`, the server's page says what LMDeploy said."""
    sim = engine("lmdeploy", transcripts.lmdeploy_healthy(), final="serve", tp=1, work=WORK,
                 dies={"after": 2.0, "transcript": "", "health": 503})
    e = exporter(config=CONFIG)
    e.wait_for(lambda s: s.value("stallwatch_probe_http_status_code", server=sim.name) == 503
               and (s.value("stallwatch_probe_failures_total", server=sim.name, reason="http_status") or 0) > 0,
               timeout=20, what="the 503")
    status, body = e.get(f"/servers/{urllib.parse.quote(sim.name, safe='')}?format=json")
    assert status == 200, body
    probes = json.loads(body)["servers"][0]["port"]["probes"]
    assert [p["reason"] for p in probes] == ["http_status: Backend scheduler_tick has not advanced for 95.3s."]
