"""trtllm-serve (simulated) end to end through real Prometheus and Alertmanager with the shipped rules: its executor's
death under a live HTTP server pages, a healthy idle one stays silent, a clean stop raises nothing; a rank of
Triton's TensorRT-LLM backend that dies under mpirun pages, and so does its executor holding requests without an
iteration (its metrics port's figures), while idle and busy ones stay silent."""

from __future__ import annotations

import time
from pathlib import Path

from support import transcripts as t
from support.configs import end_to_end
from support.harness import MPIRUN, Engine, gpus, poll
from support.stack import PIPELINE, Daemon, Webhook, alertmanager, prometheus, rule_seconds

CONFIG = end_to_end("3s")

IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5}


def test_the_executors_death_pages_an_idle_server_and_a_clean_stop_do_not(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    e = exporter(nvml={"gpus": gpus(4, used=60e9, util=0)}, config=CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    # The executor dies under MPI a few scrapes after serving began: one whose `/health` turned 503, one whose
    # `/health` still says 200 (the proxy has not noticed yet).
    died = {health: engine("trtllm", t.trtllm_healthy(), final="serve", tp=1, work=IDLE,
                           dies={"after": 4.0, "transcript": t.trtllm_executor_died(), "health": health})
            for health in (503, 200)}
    idle = engine("trtllm", t.trtllm_healthy(), final="serve", tp=1, work=IDLE)
    stopped = engine("trtllm", t.trtllm_healthy(), final="serve", tp=1, work=IDLE, on_sigterm=t.trtllm_stop())
    for sim in (*died.values(), idle, stopped):
        # Over a window: a dying one may be serving for only its few seconds between two queries.
        poll(lambda sim=sim: query(f'max_over_time(stallwatch_startup_phase{{server="{sim.name}",phase="serving"}}[5m])'
                                   ' == 1'), timeout=30, what=f"{sim.name} serving")
    stopped.terminate()
    stopped_at = time.time()
    stopped.proc.wait(30)
    e.wait_stopped_on_request(stopped.name, stopped.log)

    for health, sim in died.items():
        page = poll(lambda sim=sim: hook.find("InferenceServerFailed", sim.name, "firing"), timeout=60,
                    interval=0.2, what=f"the dead executor's page (/health {health})")
        assert page["labels"]["severity"] == "critical"
        assert page["annotations"]["description"].startswith(
            f"{sim.name} on 127.0.0.1:{e.port} logged a fatal error and is in phase failed.")

    # Long past InferenceServerDown's `for` after the stop, and several windows of the idle server's silence.
    time.sleep(max(0.0, stopped_at + rule_seconds("5m") + PIPELINE - time.time()))
    for sim in (idle, stopped):
        raised = [a["labels"] for a in hook.alerts if a["labels"].get("server") == sim.name]
        assert query(f'ALERTS{{server="{sim.name}"}}') == [] and not raised, f"{raised}\n{e.seen(sim.name, sim.log)}"
    assert query(f'stallwatch_startup_phase{{server="{stopped.name}",phase="stopped"}} == 1')


def test_a_triton_rank_that_dies_under_mpirun_pages(exporter, engine, daemons: list[Daemon], tmp_path: Path) -> None:
    """Triton serving TensorRT-LLM, one rank under mpirun (`launch_triton_server.py --world_size=1`): a few scrapes
    after its ports opened, its executor crashes the rank (`Signal (11) received.` and its stack, then SIGSEGV), and
    mpirun ends the job with Open MPI's summary (`mpirun noticed that process rank 0 ... exited on signal 11`):
    InferenceServerFailed pages, naming the failure (issue 28 item 2)."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    e = exporter(nvml={"gpus": gpus(1, used=60e9, util=0)}, config=CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    sim = engine("triton", t.triton_healthy(), final="serve", tp=1, prefix=MPIRUN,
                 dies={"after": 4.0, "transcript": t.triton_segfault(), "final": "segfault"})
    poll(lambda: query(f'max_over_time(stallwatch_startup_phase{{server="{sim.name}",phase="serving"}}[5m]) == 1'),
         timeout=30, what=f"{sim.name} serving")
    page = poll(lambda: hook.find("InferenceServerFailed", sim.name, "firing"), timeout=60, interval=0.2,
                what="the dead rank's page")
    assert page["labels"]["severity"] == "critical"
    assert sim.proc.wait(10) == 1  # mpirun ended the job
    assert "mpirun noticed that process rank 0" in sim.log.read_text()


def test_a_triton_executor_that_holds_requests_and_runs_no_iteration_pages(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    """Triton's TensorRT-LLM executor hung with 8 requests scheduled: its metrics port still says them, and its
    iteration counter (the tokens it does not count) stands still; `/v2/health/ready` says 200. NoTokenProgress
    pages from its metrics port's figures; an idle Triton (nothing scheduled) and a busy one (iterations going on)
    stay silent (issue 28)."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    e = exporter(nvml={"gpus": gpus(3, used=30e9, util=0)}, config=CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    def triton(work: dict) -> Engine:
        return engine("triton", t.triton_healthy(), final="serve", tp=1, prefix=MPIRUN, work=work)

    hung = triton({"running": 8, "waiting": 0, "throughput": 0.0, "tokens_start": 6189, "interval": 0.5})
    idle = triton(IDLE)
    busy = triton({"running": 4, "waiting": 2, "throughput": 40.0, "tokens_start": 100, "interval": 0.5})
    page = poll(lambda: hook.find("InferenceServerNoTokenProgress", hung.name, "firing"), timeout=60,
                interval=0.2, what="the hung executor's page")
    assert page["labels"]["severity"] == "critical"
    assert page["annotations"]["description"].startswith(
        f"{hung.name} on 127.0.0.1:{e.port} has had 8 or more requests running or waiting and has generated no "
        "token for 3 minutes (figures from its /metrics page); health probe passing.")
    time.sleep(rule_seconds("2m"))  # idle and busy: another whole token window
    for sim in (idle, busy):
        raised = [a["labels"] for a in hook.alerts if a["labels"].get("server") == sim.name]
        assert query(f'ALERTS{{server="{sim.name}"}}') == [] and not raised, f"{raised}\n{e.seen(sim.name, sim.log)}"
