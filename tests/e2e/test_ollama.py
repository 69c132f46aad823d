"""End to end through real Prometheus and Alertmanager: Ollama loading and unloading models raises no alert, an
Ollama that holds a loaded model on an idle GPU without traffic does not page, and a load that stalls with its runner
holding GPU memory does (issue 28 item 1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psutil

from support import transcripts as t
from support.harness import Exporter, Ollama, gpus, poll
from support.stack import PIPELINE, Daemon, Webhook, alertmanager, prometheus, rule_seconds

EXPORTER_CONFIG = ("discovery: {enabled: true, interval: 1s, forget_after: 1h}\n"
                   "defaults:\n  stall: {gpu_memory_bytes: 10e9, log_stale: 12s}\n"
                   "  probe: {timeout: 1s, interval: 1s}\n"
                   "logs: {poll_interval: 0.5s}\n"
                   "engine_metrics: {interval: 1s, timeout: 1s}\n")
MODELS = [t.OLLAMA_BLOB[:-4] + suffix for suffix in ("aaa1", "bbb2", "ccc3")]


def _load(blob: str) -> list[list[object]]:
    return [["load", blob], ["log", t.ollama_load(blob)], ["ready"], ["log", t.ollama_loaded()]]


def _stack(exporter, daemons: list[Daemon], tmp_path: Path) -> tuple[Webhook, list[dict], Exporter, Callable]:
    """Alertmanager with a webhook, the exporter over one idle GPU, and Prometheus scraping it: scraped once."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    nvml = gpus(1, used=1e9, util=0, power=60, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=EXPORTER_CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")
    return hook, nvml, e, query


def _runner(sim: Ollama) -> psutil.Process:
    """Its runner, not the interpreter's launcher before it (a pyenv shim's child)."""
    return poll(lambda: [p for p in psutil.Process(sim.proc.pid).children()
                         if "llama-server" in "".join(p.cmdline()[1:2])], what="the runner")[0]


def test_ten_load_and_unload_cycles_and_a_loaded_idle_model_raise_no_alert(
    exporter, ollama, daemons: list[Daemon], tmp_path: Path
) -> None:
    """Ten cycles of three models loaded for a second and unloaded (a keep-alive, scaled), then one model left
    loaded, holding 40 GB of an idle GPU with no request (only the probe's heartbeats in the log) for longer than
    InferenceServerDown's `for`, log_stale and the idle window together: no alert about Ollama or any runner fires."""
    hook, nvml, e, query = _stack(exporter, daemons, tmp_path)

    cycle = [*(step for blob in MODELS for step in _load(blob)), ["sleep", 1.0], *[["unload"]] * len(MODELS)]
    sim = ollama([["log", t.ollama_serving()], ["serve"], *cycle * 10, *_load(MODELS[0])], t.llamacpp_healthy())
    poll(lambda: sim.log.read_text().count("llama-server started in") == 31, timeout=90, what="31 loads")
    runner = poll(lambda: psutil.Process(sim.proc.pid).children(), what="the runner")[0]
    nvml[0].update(used=41e9, processes=[{"pid": runner.pid, "used": 40e9}])
    e.nvml.update(gpus=nvml)
    poll(lambda: query(f'stallwatch_server_gpu_memory_used_bytes{{server="{sim.name}"}} > 30e9'), timeout=30,
         what="the runner's GPU memory as the server's")

    watched = rule_seconds("5m") + 12 + rule_seconds("5m") + 10  # Down's `for`, log_stale, the idle window, margin
    time.sleep(watched)
    ours = {sim.name} | {f"llamacpp-{port}" for port in sim.runner_ports()}
    assert query(f'stallwatch_server_up{{server="{sim.name}"}} == 1')
    assert [a["metric"] for a in query("ALERTS") if a["metric"].get("server") in ours] == []
    assert [a["labels"] for a in hook.alerts if a["labels"].get("server") in ours] == []


def test_a_model_load_that_stalls_with_its_runner_holding_gpu_memory_pages(
    exporter, ollama, daemons: list[Daemon], tmp_path: Path
) -> None:
    """A serving Ollama starts a load whose runner takes 40 GB of an idle GPU and never answers (no `llama-server
    started in`, no `Load failed`: `OLLAMA_LOAD_TIMEOUT` raised), the log quiet but for the probe's heartbeats, `/`
    answering 200 throughout: InferenceServerLoadedButIdle pages, in phase loading_weights, once log_stale and the
    idle window have passed (issue 28 item 1)."""
    hook, nvml, e, query = _stack(exporter, daemons, tmp_path)

    # The runner stops in its tensors' load (its /health 503 `Loading model`): its lines are the log's last.
    until_tensors = "".join(t.llamacpp_healthy().splitlines(keepends=True)[:6])
    sim = ollama([["log", t.ollama_serving()], ["serve"], ["load", MODELS[0]], ["log", t.ollama_load(MODELS[0])]],
                 until_tensors, runner_final="stall")
    runner = _runner(sim)
    nvml[0].update(used=41e9, processes=[{"pid": runner.pid, "used": 40e9}])
    e.nvml.update(gpus=nvml)
    poll(lambda: query(f'stallwatch_startup_phase{{server="{sim.name}",phase="loading_weights"}} == 1'),
         timeout=30, what="the load's phase")
    started = time.time()
    page = poll(lambda: hook.find("InferenceServerLoadedButIdle", sim.name, "firing"), timeout=120, interval=0.2,
                what="the stalled load's page")
    assert page["received_at"] - started >= 12  # log_stale: not before the log was quiet that long
    assert "phase loading_weights" in page["annotations"]["description"]
    assert query(f'stallwatch_probe_success{{server="{sim.name}"}} == 1')  # `/` answered all along


def test_a_runner_whose_main_loop_froze_pages_while_ollama_answers(
    exporter, ollama, daemons: list[Daemon], tmp_path: Path
) -> None:
    """A model loaded and serving, its runner holding 40 GB; then its main loop freezes (a generation stuck in it):
    the runner's `/slots` never answers while Ollama's `/` says 200 and its log holds nothing but heartbeats.
    InferenceServerEngineLoopStuck pages for the server (issue 28 item 1: a runner holding GPU memory with nothing
    generated), as it does for llama.cpp's own server."""
    hook, nvml, e, query = _stack(exporter, daemons, tmp_path)
    sim = ollama([["log", t.ollama_serving()], ["serve"], *_load(MODELS[0])], t.llamacpp_healthy(),
                 runner_work={"running": 0, "waiting": 0, "throughput": 0.0, "interval": 0.5, "metrics": "hang"})
    runner = _runner(sim)
    nvml[0].update(used=41e9, processes=[{"pid": runner.pid, "used": 40e9}])
    e.nvml.update(gpus=nvml)
    poll(lambda: query(f'stallwatch_engine_loop_up{{server="{sim.name}"}} == 0'), timeout=30,
         what="the runner's loop read as down")
    frozen = time.time()
    page = poll(lambda: hook.find("InferenceServerEngineLoopStuck", sim.name, "firing"), timeout=60, interval=0.2,
                what="the frozen loop's page")
    print(f"frozen runner loop: paged {page['received_at'] - frozen:.1f} s after it was read down")
    assert page["labels"]["severity"] == "critical"
    assert query(f'stallwatch_probe_success{{server="{sim.name}"}} == 1')  # `/` answered all along
    assert query(f'stallwatch_startup_phase{{server="{sim.name}",phase="serving"}} == 1')


def test_a_clean_stop_raises_nothing_and_a_go_panic_pages(
    exporter, ollama, daemons: list[Daemon], tmp_path: Path
) -> None:
    """`ollama serve` logs nothing as it stops: one serving a loaded model, stopped with SIGTERM (it ends its runner
    first, as Ollama does), raises nothing long past InferenceServerDown's `for` (issue 28: a clean stop raises
    nothing). The counter-test: one whose Go runtime panics (its stack in the log, exit 2) pages
    InferenceServerFailed."""
    hook, _, e, query = _stack(exporter, daemons, tmp_path)
    go = tmp_path / "panic"
    stopped = ollama([["log", t.ollama_serving()], ["serve"], *_load(MODELS[0])], t.llamacpp_healthy())
    died = ollama([["log", t.ollama_serving()], ["serve"], ["wait", str(go)], ["log", t.ollama_panic()], ["exit", 2]],
                  t.llamacpp_healthy())
    for sim in (stopped, died):
        poll(lambda sim=sim: query(f'stallwatch_startup_phase{{server="{sim.name}",phase="serving"}} == 1'),
             timeout=30, what=f"{sim.name} serving")
    stopped.proc.terminate()
    stopped_at = time.time()
    stopped.proc.wait(30)
    e.wait_stopped_on_request(stopped.name, stopped.log)
    go.touch()
    page = poll(lambda: hook.find("InferenceServerFailed", died.name, "firing"), timeout=60, interval=0.2,
                what="the panicked server's page")
    assert page["labels"]["severity"] == "critical"

    time.sleep(max(0.0, stopped_at + rule_seconds("5m") + PIPELINE - time.time()))
    raised = [a["labels"] for a in hook.alerts if a["labels"].get("server") == stopped.name]
    assert query(f'ALERTS{{server="{stopped.name}"}}') == [] and not raised, \
        f"{raised}\n{e.seen(stopped.name, stopped.log)}"
