"""End to end through real Prometheus and Alertmanager: Ollama loading and unloading models raises no alert, and an
Ollama that holds a loaded model on an idle GPU without traffic does not page (issue 28 item 1)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from support import transcripts as t
from support.harness import gpus, poll
from support.stack import Daemon, Webhook, alertmanager, prometheus, rule_seconds

EXPORTER_CONFIG = ("discovery: {enabled: true, interval: 1s, forget_after: 1h}\n"
                   "defaults:\n  stall: {gpu_memory_bytes: 10e9, log_stale: 12s}\n"
                   "  probe: {timeout: 1s, interval: 1s}\n"
                   "logs: {poll_interval: 0.5s}\n")
MODELS = [t.OLLAMA_BLOB[:-4] + suffix for suffix in ("aaa1", "bbb2", "ccc3")]


def _load(blob: str) -> list[list[object]]:
    return [["load", blob], ["log", t.ollama_load(blob)], ["ready"], ["log", t.ollama_loaded()]]


def test_ten_load_and_unload_cycles_and_a_loaded_idle_model_raise_no_alert(
    exporter, ollama, daemons: list[Daemon], tmp_path: Path
) -> None:
    """Ten cycles of three models loaded for a second and unloaded (a keep-alive, scaled), then one model left
    loaded, holding 40 GB of an idle GPU with no request (only the probe's heartbeats in the log) for longer than
    InferenceServerDown's `for`, log_stale and the idle window together: no alert about Ollama or any runner fires."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    nvml = gpus(1, used=1e9, util=0, power=60, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=EXPORTER_CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

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
