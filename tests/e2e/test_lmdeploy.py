"""LMDeploy (simulated `lmdeploy serve api_server`) end to end through real Prometheus and Alertmanager with the
shipped rules: its seed stall (weights in GPU memory, GPU idle, log silent, port refused) pages, a stalled scheduler
behind its live API server (its `/health` 503) pages, a healthy idle one stays silent and a clean stop raises
nothing (issue 28 item 3)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from support import transcripts as t
from support.configs import end_to_end
from support.harness import Engine, gpus, poll
from support.stack import PIPELINE, Daemon, Webhook, alertmanager, prometheus, rule_seconds

LOG_STALE = 12.0  # seconds: at least the scaled idle window (5m -> 10 s)
CONFIG = end_to_end(f"{LOG_STALE:g}s")

IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5}


def _engine_process(sim: Engine) -> int:
    """The pid of the PyTorch engine's process (`ZMQMPEngine`), which holds the weights."""
    return poll(lambda: next((p.pid for p in psutil.Process(sim.proc.pid).children() if p.name() == "ZMQMPEngine"),
                             None), timeout=30, what=f"{sim.name}'s engine process")


def test_the_seed_stall_and_a_stalled_scheduler_page_an_idle_server_and_a_clean_stop_do_not(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    nvml = gpus(4, used=76e9, util=0, power=85, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    # The seed stall: the weights loaded (the last file's bar at 100 %), then nothing; the port never opens.
    transcript = t.lmdeploy_until_weights(files=8, info=False)
    stalled = engine("lmdeploy", transcript, final="stall", tp=1)
    # The scheduler stops ticking a few scrapes after serving began: `/health` 503, nothing logged.
    scheduler = engine("lmdeploy", t.lmdeploy_healthy(info=False), final="serve", tp=1, work=IDLE,
                       dies={"after": 4.0, "transcript": "", "health": 503})
    idle = engine("lmdeploy", t.lmdeploy_healthy(info=False), final="serve", tp=1, work=IDLE)
    stopped = engine("lmdeploy", t.lmdeploy_healthy(info=False), final="serve", tp=1, work=IDLE,
                     on_sigterm=t.lmdeploy_stop())
    for gpu, sim in enumerate((stalled, scheduler, idle, stopped)):  # each holds 75 GB of its own GPU
        nvml[gpu]["processes"] = [{"pid": _engine_process(sim), "used": 75e9}]
    e.nvml.update(gpus=nvml)
    for sim in (scheduler, idle, stopped):
        poll(lambda sim=sim: query(f'stallwatch_startup_phase{{server="{sim.name}",phase="serving"}} == 1'),
             timeout=30, what=f"{sim.name} serving")
    poll(lambda: stalled.log.stat().st_size >= len(transcript.encode()), timeout=30, what="the stall's last line")
    last_line = stalled.log.stat().st_mtime

    stopped.terminate()
    stopped_at = time.time()
    e.wait_stopped_on_request(stopped.name, stopped.log)

    page = poll(lambda: hook.find("InferenceServerLoadedButIdle", stalled.name, "firing"), timeout=90,
                interval=0.2, what="the seed stall's page")
    assert page["received_at"] - last_line >= LOG_STALE
    assert page["labels"]["severity"] == "critical"
    assert "phase loading_weights" in page["annotations"]["description"]

    page = poll(lambda: hook.find("InferenceServerProbeFailing", scheduler.name, "firing"), timeout=90,
                interval=0.2, what="the stalled scheduler's page")
    assert page["labels"]["severity"] == "critical"
    assert "last failure reason: http_status" in page["annotations"]["description"]

    # Long past InferenceServerDown's `for` after the stop, and several windows of the idle server's silence.
    time.sleep(max(0.0, stopped_at + rule_seconds("5m") + PIPELINE - time.time()))
    for sim in (idle, stopped):
        raised = [a["labels"] for a in hook.alerts if a["labels"].get("server") == sim.name]
        assert query(f'ALERTS{{server="{sim.name}"}}') == [] and not raised, f"{raised}\n{e.seen(sim.name, sim.log)}"
    assert query(f'stallwatch_startup_phase{{server="{stopped.name}",phase="stopped"}} == 1')
