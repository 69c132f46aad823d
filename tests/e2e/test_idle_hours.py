"""Hours without traffic: every engine's healthy idle server, side by side under one exporter, through the real
Prometheus with the shipped rules (time compressed) and the real Alertmanager, for two hours of the rules' time.
Each holds 75 GB of a GPU of its own at 0 %, its log silent (heartbeats at most), its probe passing: nothing fires
(issues 28 and 29: "its healthy idle server stays silent for hours of scaled time"). The real llama-server is among
them where the run has it."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from support import transcripts as t
from support.configs import end_to_end
from support.harness import MPIRUN, Engine, gpus, poll
from support.llamacpp import llama_server_available
from support.stack import Daemon, Webhook, alertmanager, prometheus, rule_seconds

LOG_STALE = 12.0  # seconds: at least the scaled idle window (5m -> 10 s)
IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5}
HELD = 75e9
OLLAMA_MODEL = t.OLLAMA_BLOB


def _start_engines(engine) -> list[Engine]:
    """One healthy idle server of each simulated engine, serving once its transcript has run."""
    started = [
        engine("sglang", t.sglang_healthy(tp=1), final="serve", tp=1, work=IDLE),
        engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1, work=IDLE),
        engine("tgi", t.tgi_healthy(), final="serve", tp=1, work=IDLE),
        engine("llamacpp", t.llamacpp_healthy(), final="serve", tp=1, work=IDLE),
        engine("trtllm", t.trtllm_healthy(), final="serve", tp=1, work=IDLE),
        engine("triton", t.triton_healthy(), final="serve", tp=1, prefix=MPIRUN),
        engine("lmdeploy", t.lmdeploy_healthy(info=False), final="serve", tp=1, work=IDLE),
        engine("aphrodite-vllm", t.aphrodite_healthy(), final="serve", tp=1, work=IDLE),
        engine("xinference", t.xinference_model_loaded("qwen-idle-0"), final="serve", tp=1,
               children=["Model: qwen-idle-0"], http="none"),
    ]
    for name, healthy, flag in (("dynamo-vllm", t.dynamo_vllm_healthy(), "--model"),
                                ("dynamo-sglang", t.dynamo_sglang_healthy(), "--model"),
                                ("dynamo-trtllm", t.dynamo_trtllm_healthy("Qwen/Qwen3-0.6B"), "--model-path")):
        started.append(engine(name, healthy, final="serve", tp=1, args=(flag, "Qwen/Qwen3-0.6B"), http="none"))
    return started


def _holder(pid: int) -> int:
    """The process that holds the server's GPU memory: an Xinference worker's model process (the server, a child
    titled `Model: <uid>`), Triton's rank under mpirun (the server, its child), else the engine's own process."""
    argv = psutil.Process(pid).cmdline()
    if any(arg.endswith("xinference-local") for arg in argv):
        return poll(lambda: next((p.pid for p in psutil.Process(pid).children()
                                  if " ".join(p.cmdline()).startswith("Model: ")), None),
                    timeout=30, what="the Xinference model process")
    if argv[1:2] == MPIRUN[:1]:
        return poll(lambda: next((p.pid for p in psutil.Process(pid).children()), None), timeout=30,
                    what="mpirun's rank")
    return pid


def test_every_engines_healthy_idle_server_is_silent_for_two_hours(
    exporter, engine, ollama, daemons: list[Daemon], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook, shipped=True)
    nvml = gpus(16, used=1e9, util=0, power=85, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=end_to_end(f"{LOG_STALE:g}s"))
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    holders = [sim.proc.pid for sim in _start_engines(engine)]
    loads = [["load", OLLAMA_MODEL], ["log", t.ollama_load(OLLAMA_MODEL)], ["ready"], ["log", t.ollama_loaded()]]
    served = ollama([["log", t.ollama_serving()], ["serve"], *loads], t.llamacpp_healthy())
    # Its runner, not the interpreter's launcher before it (a pyenv shim's child, gone a moment later).
    holders.append(poll(lambda: [p for p in psutil.Process(served.proc.pid).children()
                                 if "llama-server" in "".join(p.cmdline()[1:2])], timeout=30,
                        what="Ollama's runner")[0].pid)
    if llama_server_available():
        real = request.getfixturevalue("llama")()
        real.wait_healthy()
        holders.append(real.proc.pid)
    for gpu, pid in enumerate(holders):  # each holds 75 GB of a GPU of its own
        nvml[gpu].update(used=HELD + 1e9, processes=[{"pid": _holder(pid), "used": HELD}])
    e.nvml.update(gpus=nvml)

    def serving() -> list[str]:
        found = query('stallwatch_startup_phase{phase="serving"} == 1 '
                      f'and on (server) stallwatch_server_gpu_memory_used_bytes > {HELD / 2:g}')
        return sorted(s["metric"]["server"] for s in found)

    poll(lambda: len(serving()) == len(holders), timeout=60, what=f"{len(holders)} servers serving on their GPUs")
    names = serving()
    engines = {s["metric"]["engine"] for s in query("stallwatch_server_info")}
    print(f"idle for {rule_seconds('2h'):g} s (two hours of the rules' time): {', '.join(names)}")

    # Its own servers' alerts and the node's (no `server`): the exporter also finds what other tests run beside it.
    def ours(labels: dict) -> bool:
        return labels.get("server", names[0]) in names

    until = time.monotonic() + rule_seconds("2h")
    while time.monotonic() < until:
        firing = [a["metric"] for a in query('ALERTS{alertstate="firing"}') if ours(a["metric"])]
        assert firing == [], f"{firing}\nthe exporter: " + "\n".join(
            line for line in e.scrape().text.splitlines() if not line.startswith("#")
            and any(f'"{a.get("server")}"' in line for a in firing))
        time.sleep(1)
    assert [a["labels"] for a in hook.alerts if ours(a["labels"])] == []
    assert serving() == names  # still serving, every one: the silence was not a scrape that stopped
    assert {"sglang", "vllm", "tgi", "llamacpp", "trtllm", "triton", "lmdeploy", "aphrodite-vllm", "xinference",
            "dynamo-vllm", "dynamo-sglang", "dynamo-trtllm", "ollama"} <= engines, engines
