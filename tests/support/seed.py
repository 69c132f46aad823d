"""The e2e tests' exporter settings and the seed stall beside a healthy idle server, as the tests through a real
ruler stage them (tests/e2e/test_alerts.py with Prometheus, tests/e2e/test_vmalert.py with vmalert)."""

from __future__ import annotations

import re
from collections.abc import Callable

import psutil

from support import transcripts as t
from support.harness import Engine, Exporter, poll

EXPORTER_CONFIG = ("discovery: {enabled: true, interval: 1s}\n"
                   "defaults:\n  stall: {gpu_memory_bytes: 70e9, log_stale: 3s}\n"
                   "  probe: {timeout: 1s, interval: 1s}\n"
                   "logs: {poll_interval: 0.5s}\n"
                   "engine_metrics: {interval: 1s, timeout: 1s}\n")

STALL_LOG_STALE = 12.0  # seconds: at least the scaled idle window (5m -> 10 s), as the latency promise assumes
STALL_CONFIG = EXPORTER_CONFIG.replace("log_stale: 3s", f"log_stale: {STALL_LOG_STALE:g}s")


def pids_with_titles(main: int, prefix: str, count: int) -> list[int]:
    """The pids of `main`'s children titled `prefix...`, in rank order, once all `count` are there."""
    found = {p.cmdline()[0]: p.pid for p in psutil.Process(main).children(recursive=True)
             if p.cmdline() and p.cmdline()[0].startswith(prefix)}
    return [found[k] for k in sorted(found, key=lambda k: int(re.sub(r"\D", "", k) or 0))] \
        if len(found) == count else []


def seed_stall_beside_idle(engine: Callable[..., Engine], exporter: Exporter, nvml: list[dict],
                           transcript: str) -> tuple[Engine, Engine]:
    """The seed stall (SGLang TP=8 that logs `transcript` and stops) on GPUs 0-7 and a healthy idle vLLM on 8 and 9
    (serving, its /metrics page 0 running and 0 waiting, its counter still), each GPU holding 75 GB of its server's;
    the stalled server and the idle one."""
    stalled = engine("sglang", transcript, final="stall", tp=8)
    idle = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1,
                  work={"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5})
    tp = poll(lambda: pids_with_titles(stalled.proc.pid, "sglang::scheduler_TP", 8), timeout=30, what="8 schedulers")
    core = poll(lambda: pids_with_titles(idle.proc.pid, "VLLM::EngineCore", 1), timeout=30, what="EngineCore")
    for gpu, pid in enumerate(tp + core + core):
        nvml[gpu]["processes"] = [{"pid": pid, "used": 75e9}]
    exporter.nvml.update(gpus=nvml)
    return stalled, idle
