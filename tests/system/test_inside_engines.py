"""Engines that are vLLM inside (simulated) through the exporter: a Dynamo vLLM worker with and without its system
port, and Aphrodite; each discovered with the engine inside in its engine label value, its children as vLLM's roles,
serving, and its figures read from the page it serves."""

from __future__ import annotations

from support import transcripts
from support.configs import ENGINE_PAGES
from support.harness import Scrape, free_port

CONFIG = ENGINE_PAGES

WORK = {"running": 3, "waiting": 1, "throughput": 0.0, "tokens_start": 5000, "interval": 0.3}


def _info(s: Scrape, server: str) -> dict[str, str]:
    return next(x.labels for x in s.samples("stallwatch_server_info") if x.labels["server"] == server)


def _roles(s: Scrape, server: str) -> set[str]:
    return {x.labels["process"] for x in s.samples("stallwatch_process_threads") if x.labels["server"] == server}


def test_a_dynamo_vllm_worker_with_and_without_its_system_port(exporter, engine) -> None:
    """Without `DYN_SYSTEM_PORT` it has no port: named after its model, nothing probed, serving from its log; with
    it, probed and its re-exported vLLM page read there."""
    model = ("--model", "Qwen/Qwen3-0.6B")
    headless = engine("dynamo-vllm", transcripts.dynamo_vllm_healthy(), final="serve", tp=2, http="none",
                      args=model)
    port = free_port()
    system = engine("dynamo-vllm", transcripts.dynamo_vllm_healthy(), final="serve", tp=1, port=port, work=WORK,
                    env={"DYN_SYSTEM_PORT": str(port)}, args=model)
    e = exporter(config=CONFIG)
    name = "dynamo-vllm-Qwen3-0.6B"
    s = e.wait_for(lambda s: s.phase(name) == "serving" and s.phase(system.name) == "serving"
                   and s.value("stallwatch_engine_metrics_up", server=system.name) == 1
                   and {"EngineCore", "Worker_TP0", "Worker_TP1"} <= _roles(s, name)
                   and "EngineCore" in _roles(s, system.name) and s,
                   what="both workers serving, their children titled, the one with a system port read")
    assert system.name == f"dynamo-vllm-{port}"
    for server in (name, system.name):
        info = _info(s, server)
        assert (info["engine"], info["model"]) == ("dynamo-vllm", "Qwen/Qwen3-0.6B"), info
        assert s.value("stallwatch_log_events_total", server=server, event="fatal") == 0
    assert s.value("stallwatch_probe_success", server=name) is None
    assert s.value("stallwatch_probe_success", server=system.name) == 1
    assert s.value("stallwatch_engine_requests_running", server=system.name, source="metrics") == 3
    assert s.value("stallwatch_engine_generated_tokens_total", server=system.name, source="metrics") == 5000
    assert headless.proc.poll() is None


def test_aphrodite_is_discovered_serves_and_its_figures_are_read(exporter, engine) -> None:
    sim = engine("aphrodite-vllm", transcripts.aphrodite_healthy(), final="serve", tp=2,
                 work={**WORK, "running": 2})
    e = exporter(config=CONFIG)
    s = e.wait_for(lambda s: s.phase(sim.name) == "serving"
                   and s.value("stallwatch_engine_metrics_up", server=sim.name) == 1
                   and s.value("stallwatch_engine_requests_running", server=sim.name, source="log") is not None
                   and {"EngineCore", "Worker_TP0", "Worker_TP1"} <= _roles(s, sim.name)
                   and s, what="aphrodite serving with its figures, its children titled")
    info = _info(s, sim.name)
    assert (info["engine"], info["model"]) == ("aphrodite-vllm", "PygmalionAI/Eleusis-12B"), info
    assert s.value("stallwatch_engine_requests_running", server=sim.name, source="metrics") == 2
    assert s.value("stallwatch_engine_requests_waiting", server=sim.name, source="metrics") == 1
    assert s.value("stallwatch_engine_requests_running", server=sim.name, source="log") == 2  # its stats line
    assert s.value("stallwatch_probe_success", server=sim.name) == 1
    assert s.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 0


def test_an_xinference_model_process_is_the_server_its_worker_is_not(exporter, engine) -> None:
    """The worker (`xinference-local`) runs a model process titled `Model: <uid>` by setproctitle, as Xinference's
    actor titles itself: that process is the server, named after its uid, its log the worker's output it shares."""
    engine("xinference", transcripts.xinference_model_loaded(), final="serve", tp=1, http="none",
           children=["Model: qwen2.5-instruct-0"])
    e = exporter(config=CONFIG)
    name = "xinference-qwen2.5-instruct-0"
    s = e.wait_for(lambda s: s.phase(name) == "serving" and s, what="the model process serving")
    info = _info(s, name)
    assert (info["engine"], info["model"]) == ("xinference", "qwen2.5-instruct-0"), info
    assert s.value("stallwatch_probe_success", server=name) is None
    assert not [ls for ls in s.labelsets("stallwatch_server_info") if ls["server"].startswith("xinference-")
                and ls["server"] != name]
