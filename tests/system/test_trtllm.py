"""trtllm-serve (simulated) through the exporter: discovered, serving, its figures read from `/prometheus/metrics`
and never from its JSON `/metrics`, and its executor's death behind a live HTTP server read as failed. Triton's
TensorRT-LLM ranks under mpirun: one server, whose GPU memory and CPU are every rank's; its figures from its metrics
port."""

from __future__ import annotations

import time

import psutil

from support import transcripts
from support.configs import ENGINE_PAGES
from support.harness import Exporter, gpus, mpirun, poll

CONFIG = ENGINE_PAGES

WORK = {"running": 3, "waiting": 1, "throughput": 0.0, "tokens_start": 5000, "interval": 0.3}


def test_trtllm_serve_is_discovered_serves_and_its_figures_come_from_the_prometheus_page(exporter, engine) -> None:
    """The JSON `/metrics` says 1003 running and 99999999 tokens: the figures are the text page's 3 and 5000."""
    sim = engine("trtllm", transcripts.trtllm_healthy(), final="serve", tp=1, work=WORK)
    e: Exporter = exporter(config=CONFIG)
    s = e.wait_for(lambda s: s.value("stallwatch_engine_metrics_up", server=sim.name) == 1
                   and s.phase(sim.name) == "serving" and s, what="trtllm serving with its figures")
    info = [x.labels for x in s.samples("stallwatch_server_info") if x.labels["server"] == sim.name]
    assert info and info[0]["engine"] == "trtllm" and info[0]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert s.value("stallwatch_engine_requests_running", server=sim.name, source="metrics") == 3
    assert s.value("stallwatch_engine_requests_waiting", server=sim.name, source="metrics") == 1
    assert s.value("stallwatch_engine_generated_tokens_total", server=sim.name, source="metrics") == 5000
    assert s.value("stallwatch_probe_success", server=sim.name) == 1
    assert s.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 0


def test_without_return_perf_metrics_there_is_no_page_not_a_failing_one(exporter, engine) -> None:
    """`/prometheus/metrics` answers 404 when `return_perf_metrics` is off: no `engine_metrics_up` sample (as an
    engine started without its metrics flag), and its JSON `/metrics` is not taken instead; beside it one with the
    page on, fetched by the same loops."""
    off = engine("trtllm", transcripts.trtllm_healthy(), final="serve", tp=1, work={**WORK, "metrics": "off"})
    on = engine("trtllm", transcripts.trtllm_healthy(), final="serve", tp=1, work=WORK)
    e = exporter(config=CONFIG)
    e.wait_for(lambda s: s.value("stallwatch_engine_metrics_up", server=on.name) == 1
               and s.phase(off.name) == "serving", what="both serving, the one with its page read")
    time.sleep(1.0)  # several fetches of both pages later
    s = e.scrape()
    assert s.value("stallwatch_engine_metrics_up", server=off.name) is None
    assert s.value("stallwatch_engine_requests_running", server=off.name, source="metrics") is None
    assert s.value("stallwatch_probe_success", server=off.name) == 1


def test_the_executors_death_under_a_live_http_server_is_failed(exporter, engine) -> None:
    """Open MPI's lines of a dead rank while uvicorn answers: failed, whether `/health` turned 503 or still says
    200 (the probe does not make it serving again)."""
    still_200 = engine("trtllm", transcripts.trtllm_healthy(), final="serve", tp=1, work=WORK,
                       dies={"after": 3.0, "transcript": transcripts.trtllm_executor_died(), "health": 200})
    unavailable = engine("trtllm", transcripts.trtllm_healthy(), final="serve", tp=1, work=WORK,
                         dies={"after": 3.0, "transcript": transcripts.trtllm_executor_died(), "health": 503})
    e = exporter(config=CONFIG)
    e.wait_for(lambda s: all(s.phase(sim.name) == "serving" for sim in (still_200, unavailable)),
               what="both serving first")
    s = e.wait_for(lambda s: all(s.phase(sim.name) == "failed" for sim in (still_200, unavailable))
                   and s.value("stallwatch_probe_http_status_code", server=unavailable.name) == 503 and s,
                   timeout=20, what="both failed")
    for sim in (still_200, unavailable):
        assert (s.value("stallwatch_log_events_total", server=sim.name, event="fatal") or 0) >= 1, sim.name
        assert s.value("stallwatch_server_up", server=sim.name) == 1, sim.name
    failed_at = s.value("stallwatch_startup_phase_start_timestamp_seconds", server=still_200.name) or 0
    later = e.wait_for(lambda s: (s.value("stallwatch_probe_last_success_timestamp_seconds", server=still_200.name)
                                  or 0) > failed_at + 1 and s, what="a probe that answered after the failure")
    assert later.phase(still_200.name) == "failed"


def test_tritons_ranks_under_mpirun_are_one_server_holding_every_ranks_gpu_memory(exporter, engine) -> None:
    """`launch_triton_server.py --world_size=2`: two `tritonserver` ranks under mpirun, each holding 30 GB on its own
    GPU. Rank 0 is the server `triton-<port>`; rank 1 (mpirun's other child, not rank 0's) is no server of its own,
    and its memory on GPU 1 and its CPU are the server's (`process="rank1"`), so the held-memory rules see the whole
    engine (issue 28)."""
    e: Exporter = exporter(nvml={"gpus": gpus(2, used=30e9, util=0)}, config=CONFIG)
    sim = engine("triton", transcripts.triton_healthy(), final="serve", tp=1, prefix=mpirun(2))
    launcher = psutil.Process(sim.proc.pid)
    ranks = poll(lambda: (r := sorted(launcher.children(), key=lambda p: p.create_time())) and len(r) == 2 and r,
                 timeout=30, what="mpirun's two ranks")
    e.nvml.update(gpus=[dict(g, processes=[{"pid": rank.pid, "used": 30e9}])
                        for g, rank in zip(gpus(2, used=30e9, util=0), ranks, strict=True)])
    s = e.wait_for(lambda s: s.phase(sim.name) == "serving"
                   and s.value("stallwatch_server_gpu_memory_used_bytes", server=sim.name, gpu="1") == 30e9 and s,
                   timeout=30, what="rank 1's memory on GPU 1 the server's")
    assert s.value("stallwatch_server_gpu_memory_used_bytes", server=sim.name, gpu="0") == 30e9
    assert [x.labels["server"] for x in s.samples("stallwatch_server_up")
            if x.labels["server"].startswith("triton-")] == [sim.name]
    assert s.value("stallwatch_process_cpu_seconds_total", server=sim.name, process="rank1", mode="user") is not None


def test_tritons_figures_come_from_its_metrics_port_and_a_page_of_other_backends_is_none(exporter, engine) -> None:
    """Triton's metrics service on `--metrics-port` (not its HTTP port, which serves no `/metrics`): the TensorRT-LLM
    backend's scheduled and waiting requests and its executor's iteration counter as the tokens. A Triton serving
    models of other backends (no `nv_trt_llm_*` on its page) has no figures: no `engine_metrics_up` sample, not a
    failing page (issue 28)."""
    e: Exporter = exporter(config=CONFIG)
    trtllm = engine("triton", transcripts.triton_healthy(), final="serve", tp=1, work=WORK)
    other = engine("triton", transcripts.triton_healthy(), final="serve", tp=1, work={**WORK, "metrics": "core"})
    s = e.wait_for(lambda s: s.value("stallwatch_engine_metrics_up", server=trtllm.name) == 1
                   and s.phase(other.name) == "serving" and s, what="Triton's figures read")
    assert s.value("stallwatch_engine_requests_running", server=trtllm.name, source="metrics") == 3
    assert s.value("stallwatch_engine_requests_waiting", server=trtllm.name, source="metrics") == 1
    assert s.value("stallwatch_engine_generated_tokens_total", server=trtllm.name, source="metrics") == 5000
    # Over several of its fetches (one each 0.3 s): no figures, and no failure said.
    for _ in range(6):
        time.sleep(0.3)
        s = e.scrape()
        assert s.value("stallwatch_engine_metrics_up", server=other.name) is None
        assert s.value("stallwatch_engine_requests_running", server=other.name, source="metrics") is None
    assert "engine metrics of " + other.name not in e.log.read_text()
