"""Ollama under the real exporter with no server configured: `ollama serve` (tests/sim/bin/ollama) is one server, the
`llama-server` runner it starts per model load and ends after its keep-alive is its role `runner`, never a llama.cpp
server of its own named after a random port (issue 28 item 1), and a load that times out is a ticket's fatal event."""

from __future__ import annotations

from pathlib import Path

from support import transcripts as t
from support.configs import FAST_REMEMBERING
from support.harness import Scrape, diagnose, poll

MODELS = [t.OLLAMA_BLOB[:-4] + suffix for suffix in ("aaa1", "bbb2", "ccc3")]


def _load(blob: str) -> list[list[object]]:
    return [["load", blob], ["log", t.ollama_load(blob)], ["ready"], ["log", t.ollama_loaded()]]


def _series(scrape: Scrape, servers: set[str]) -> list[str]:
    return [s.name for f in scrape.families.values() for s in f.samples if s.labels.get("server") in servers]


def _roles(scrape: Scrape, server: str, family: str = "stallwatch_process_threads") -> set[str]:
    return {ls["process"] for ls in scrape.labelsets(family) if ls["server"] == server}


def _phase(scrape: Scrape, server: str) -> str | None:
    return next((s.labels["phase"] for s in scrape.samples("stallwatch_startup_phase")
                 if s.labels.get("server") == server and s.value == 1), None)


def test_ten_load_and_unload_cycles_of_three_models_are_one_server_that_raises_nothing(exporter, ollama,
                                                                                        tmp_path: Path) -> None:
    """Ollama on the port its `OLLAMA_HOST` gives is `ollama-<port>`, its runners its role `runner` while loaded;
    thirty loads and unloads later the exporter has one server's series, still up and serving, no restart and no
    fatal event, and no runner was ever a server (a gone one stays listed for `forget_after`, 30 s here)."""
    gate = tmp_path / "unload"
    loads = [step for blob in MODELS for step in _load(blob)]
    unloads = [["unload"]] * len(MODELS)
    cycles = [*loads, ["wait", str(gate)], *unloads] + [*loads, ["sleep", 0.3], *unloads] * 9
    e = exporter(config=FAST_REMEMBERING)
    sim = ollama([["log", t.ollama_serving()], ["serve"], *cycles],
                 t.llamacpp_healthy())
    scrape = e.wait_for(lambda s: "runner" in _roles(s, sim.name) and s, timeout=20, what="the runners as a role")
    assert _roles(scrape, sim.name) == {"main", "runner"}
    assert scrape.value("stallwatch_server_info", server=sim.name, engine="ollama") == 1
    # Its runners' main loops answer their `/slots`.
    e.wait_for(lambda s: s.value("stallwatch_engine_loop_up", server=sim.name) == 1, timeout=20,
               what="the runners' loops answering")
    gate.touch()
    poll(lambda: len(sim.runner_ports()) == 30 and sim.log.read_text().count("llama-server started in") == 30,
         timeout=60, what="thirty loads")
    # The process table can see the last runner gone before the log follower has read its ready line (CI, loaded):
    # both, then.
    scrape = e.wait_for(lambda s: sum(s.value("stallwatch_server_processes", **ls) or 0 for ls in
                                      s.labelsets("stallwatch_server_processes") if ls["server"] == sim.name) == 1
                        and _phase(s, sim.name) == "serving" and s, what="the last runner gone, the server serving")
    runners = {f"llamacpp-{port}" for port in sim.runner_ports()}
    assert _series(scrape, runners) == []
    assert scrape.value("stallwatch_server_up", server=sim.name) == 1
    assert scrape.probe("stallwatch_probe_success", server=sim.name, url=f"http://127.0.0.1:{sim.port}/") == 1
    events = {ls["event"]: scrape.value("stallwatch_log_events_total", **ls)
              for ls in scrape.labelsets("stallwatch_log_events_total") if ls["server"] == sim.name}
    assert events and not any(events.values()), events
    # The runners are gone, their CPU stays counted.
    assert _roles(scrape, sim.name) == {"main"}
    assert _roles(scrape, sim.name, "stallwatch_process_cpu_seconds_total") == {"main", "runner"}


def test_a_load_that_times_out_is_a_fatal_event_of_a_server_that_keeps_serving(exporter, ollama) -> None:
    """The runner never answers (its port stays closed): after `OLLAMA_LOAD_TIMEOUT` Ollama logs `Load failed ...
    timed out waiting for llama-server to start - ` and kills it. One fatal event; the phase stays `serving`, and
    Ollama stopped later (SIGTERM, its runners ended first) is `stopped`, not `failed`: the failure was a model's."""
    e = exporter(config=FAST_REMEMBERING)
    sim = ollama([["log", t.ollama_serving()], ["serve"], ["load", MODELS[0]], ["log", t.ollama_load(MODELS[0])],
                  ["sleep", 1.0], ["log", t.ollama_load_timeout(MODELS[0])], ["unload"]],
                 t.llamacpp_healthy(), runner_final="stall")
    scrape = e.wait_for(lambda s: s.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 1 and s,
                        timeout=20, what="the failed load counted")
    assert _phase(scrape, sim.name) == "serving"
    assert scrape.value("stallwatch_server_up", server=sim.name) == 1
    assert _series(scrape, {f"llamacpp-{port}" for port in sim.runner_ports()}) == []
    sim.proc.terminate()
    sim.proc.wait(10)
    # Its tree is read at most every TREE_CACHE_SECONDS: `server_up` may follow the phase by one reading.
    e.wait_for(lambda s: _phase(s, sim.name) == "stopped" and s.value("stallwatch_server_up", server=sim.name) == 0,
               what="stopped and down")


def test_a_runner_whose_main_loop_froze_reads_loop_down_while_ollama_answers(exporter, ollama) -> None:
    """A model loaded, then its runner's main loop freezes: its `/slots` never answers (as llama-server's, which its
    loop answers), while Ollama's own `/` still says 200. The server reads up and serving with its loop down
    (stallwatch_engine_loop_up 0, what InferenceServerEngineLoopStuck reads); no llama.cpp server appears."""
    e = exporter(config=FAST_REMEMBERING + "engine_metrics: {interval: 0.2s, timeout: 1s}\n")
    sim = ollama([["log", t.ollama_serving()], ["serve"], *_load(MODELS[0])], t.llamacpp_healthy(),
                 runner_work={"running": 0, "waiting": 0, "throughput": 0.0, "interval": 0.5, "metrics": "hang"})
    scrape = e.wait_for(lambda s: s.value("stallwatch_engine_loop_up", server=sim.name) == 0 and s, timeout=20,
                        what="the runner's loop read as down")
    assert _phase(scrape, sim.name) == "serving"
    assert scrape.value("stallwatch_server_up", server=sim.name) == 1
    assert scrape.probe("stallwatch_probe_success", server=sim.name, url=f"http://127.0.0.1:{sim.port}/") == 1
    assert _series(scrape, {f"llamacpp-{port}" for port in sim.runner_ports()}) == []


def test_the_loaded_models_and_their_gpu_memory_are_read_from_api_ps(exporter, ollama, tmp_path: Path) -> None:
    """`/api/ps` while two models are loaded: a series each with the bytes it holds; the last one unloaded, its
    series is gone and the other's stays (fetched with the engine pages, at the probe's address); `diagnose`
    lists them."""
    gate = tmp_path / "unload"
    e = exporter(config=FAST_REMEMBERING + "engine_metrics: {interval: 0.2s, timeout: 1s}\n")
    steps = [["log", t.ollama_serving()], ["serve"],
             ["load", MODELS[0], "llama3.2:latest", 3155590144], ["log", t.ollama_load(MODELS[0])], ["ready"],
             ["load", MODELS[1], "qwen3:32b", 20971520000], ["log", t.ollama_load(MODELS[1])], ["ready"],
             ["wait", str(gate)], ["unload"]]
    sim = ollama(steps, t.llamacpp_healthy())

    def loaded(s: Scrape) -> dict[str, float]:
        return {ls["model"]: s.value("stallwatch_engine_model_gpu_memory_bytes", **ls) or 0.0
                for ls in s.labelsets("stallwatch_engine_model_gpu_memory_bytes") if ls["server"] == sim.name}

    e.wait_for(lambda s: loaded(s) == {"llama3.2:latest": 3155590144.0, "qwen3:32b": 20971520000.0}, timeout=20,
               what="both models with their GPU memory")
    # `diagnose` reads the page too (issue 28: the loaded models where the verdict is read).
    report = diagnose(tmp_path, sim.name, config=None)
    assert ('models loaded (the engine\'s own list): "llama3.2:latest" 3.2 GB of GPU memory, "qwen3:32b" 21.0 GB of '
            'GPU memory') in report.stdout, report.stdout + report.stderr
    gate.touch()
    e.wait_for(lambda s: loaded(s) == {"llama3.2:latest": 3155590144.0}, timeout=20, what="the unloaded one gone")
