"""Engines that are vLLM, SGLang or TensorRT-LLM inside (simulated), end to end through real Prometheus and
Alertmanager with the shipped rules: Dynamo's vLLM, SGLang and TensorRT-LLM workers without a system port (nothing to
probe: the log alone says it serves), Aphrodite, an Xinference model process and Triton's TensorRT-LLM backend (issue
28 item 2), each in its seed stall (weights in
GPU memory, GPU idle, log silent, not ready) pages; a healthy idle one stays silent and a clean stop raises nothing
(issue 28 item 4)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from support import transcripts as t
from support.configs import end_to_end
from support.harness import MPIRUN, Engine, gpus, poll
from support.paths import SIM_BIN
from support.stack import PIPELINE, Daemon, Webhook, alertmanager, prometheus, rule_seconds

LOG_STALE = 12.0  # seconds: at least the scaled idle window (5m -> 10 s)
CONFIG = end_to_end(f"{LOG_STALE:g}s")
IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5}

# engine, the seed stall's transcript, a healthy start's, its stop, and what the simulator serves once up.
ENGINES = {
    "dynamo-vllm": (t.dynamo_vllm_until_shards(), t.dynamo_vllm_healthy(), t.dynamo_stop(), {"http": "none"}),
    "dynamo-sglang": (t.dynamo_sglang_until_shards(), t.dynamo_sglang_healthy(), t.dynamo_stop(), {"http": "none"}),
    "dynamo-trtllm": (t.dynamo_trtllm_until_weights(), t.dynamo_trtllm_healthy(), t.dynamo_stop(), {"http": "none"}),
    # A worker's model process (titled `Model: <uid>`) is the server; it ends without a line (`exit_is_stop`).
    "xinference": (t.xinference_until_shards(), "", "", {"http": "none"}),
    "aphrodite-vllm": (t.aphrodite_until_shards(), t.aphrodite_healthy(), t.aphrodite_stop(), {"work": IDLE}),
    # Triton serving TensorRT-LLM: its stall ends where the engine is in GPU memory and no port opened; the idle and
    # stopped ones run under mpirun as TensorRT-LLM's launcher starts them (the stop forwarded to the rank).
    "triton": (t.triton_until_engine(), t.triton_healthy(), t.triton_stop(), {"prefix": MPIRUN}),
}
# The model's flag where it is not `--model`: the TensorRT-LLM worker's `--model-path` (its documented flag, kept as
# `--model`'s obsolete spelling in `dynamo/trtllm/backend_args.py`).
MODEL_FLAGS = {"dynamo-trtllm": "--model-path"}


def _engine_core(sim: Engine) -> int:
    """The pid of its engine's child that holds the weights: vLLM's `...::EngineCore`, SGLang's scheduler, an
    Xinference worker's model process; TensorRT-LLM's executor is an MPI worker without a title, which the simulator
    does not start: the worker's own process holds them, as Triton's rank does (mpirun's child, under mpirun)."""
    if sim.name.startswith("dynamo-trtllm-"):
        return sim.proc.pid
    if sim.name.startswith("triton-"):
        main = psutil.Process(sim.proc.pid)
        return poll(lambda: next((p.pid for p in (main, *main.children())
                                  if p.cmdline()[1:2] == [str(SIM_BIN / "tritonserver")]), None),
                    timeout=30, what=f"{sim.name}'s rank")
    return poll(lambda: next((p.pid for p in psutil.Process(sim.proc.pid).children()
                              if p.cmdline() and (p.cmdline()[0].endswith(("::EngineCore", "::scheduler"))
                                                  or " ".join(p.cmdline()).startswith("Model: "))), None),
                timeout=30, what=f"{sim.name}'s engine core")


@pytest.mark.parametrize("engine_name", list(ENGINES))
def test_the_seed_stall_pages_an_idle_server_and_a_clean_stop_do_not(
    exporter, engine, daemons: list[Daemon], tmp_path: Path, engine_name: str
) -> None:
    until_shards, healthy, stop, serving = ENGINES[engine_name]
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    nvml = gpus(3, used=76e9, util=0, power=85, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    if engine_name.startswith("dynamo-"):  # one worker per model: three models
        stalled_model, idle_model, stopped_model = "Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B", "Qwen/Qwen3-4B"
        flag = MODEL_FLAGS.get(engine_name, "--model")
        stalled = engine(engine_name, until_shards, final="stall", tp=1, args=(flag, stalled_model))
        idle = engine(engine_name, healthy.replace(stalled_model, idle_model), final="serve", tp=1,
                      args=(flag, idle_model), **serving)
        stopped = engine(engine_name, healthy.replace(stalled_model, stopped_model), final="serve", tp=1,
                         args=(flag, stopped_model), on_sigterm=stop, **serving)
        names = {sim: f"{engine_name}-{model.rsplit('/', 1)[1]}"
                 for sim, model in ((stalled, stalled_model), (idle, idle_model), (stopped, stopped_model))}
    elif engine_name == "xinference":  # one model process per worker, named after its uid
        uids = ("qwen-stalled-0", "qwen-idle-0", "qwen-stopped-0")
        stalled = engine(engine_name, until_shards, final="stall", tp=1, children=[f"Model: {uids[0]}"], **serving)
        idle = engine(engine_name, t.xinference_model_loaded(uids[1]), final="serve", tp=1,
                      children=[f"Model: {uids[1]}"], **serving)
        stopped = engine(engine_name, t.xinference_model_loaded(uids[2]), final="serve", tp=1,
                         children=[f"Model: {uids[2]}"], on_sigterm=stop, **serving)
        names = {sim: f"xinference-{uid}" for sim, uid in zip((stalled, idle, stopped), uids, strict=True)}
    else:
        stalled = engine(engine_name, until_shards, final="stall", tp=1)
        idle = engine(engine_name, healthy, final="serve", tp=1, **serving)
        stopped = engine(engine_name, healthy, final="serve", tp=1, on_sigterm=stop, **serving)
        names = {sim: sim.name for sim in (stalled, idle, stopped)}
    for gpu, sim in enumerate((stalled, idle, stopped)):  # each holds 75 GB of its own GPU
        nvml[gpu]["processes"] = [{"pid": _engine_core(sim), "used": 75e9}]
    e.nvml.update(gpus=nvml)
    for sim in (idle, stopped):
        poll(lambda sim=sim: query(f'stallwatch_startup_phase{{server="{names[sim]}",phase="serving"}} == 1'),
             timeout=30, what=f"{names[sim]} serving")
    info = query(f'stallwatch_server_info{{server="{names[idle]}"}}')
    assert info and info[0]["metric"]["engine"] == engine_name
    poll(lambda: stalled.log.stat().st_size >= len(until_shards.encode()), timeout=30, what="the stall's last line")
    last_line = stalled.log.stat().st_mtime

    stopped.terminate()
    stopped_at = time.time()
    e.wait_stopped_on_request(names[stopped], stopped.log)

    page = poll(lambda: hook.find("InferenceServerLoadedButIdle", names[stalled], "firing"), timeout=90,
                interval=0.2, what="the seed stall's page")
    assert page["received_at"] - last_line >= LOG_STALE
    assert page["labels"]["severity"] == "critical"
    assert "phase loading_weights" in page["annotations"]["description"]

    # Long past InferenceServerDown's `for` after the stop, and several windows of the idle server's silence.
    time.sleep(max(0.0, stopped_at + rule_seconds("5m") + PIPELINE - time.time()))
    for sim in (idle, stopped):
        raised = [a["labels"] for a in hook.alerts if a["labels"].get("server") == names[sim]]
        assert query(f'ALERTS{{server="{names[sim]}"}}') == [] and not raised, \
            f"{raised}\n{e.seen(names[sim], sim.log)}"
    assert query(f'stallwatch_startup_phase{{server="{names[stopped]}",phase="stopped"}} == 1')
