"""Engines that are vLLM or SGLang inside, as their logs read: a Dynamo worker's lines in Dynamo's format (one launch,
however many banners its engine prints), Aphrodite's default format, Xinference's model process."""

from __future__ import annotations

import pytest

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.stats_lines import last_stats
from stallwatch.signals.engine_page import parse_page
from support import transcripts as t
from support.feeding import fed
from support.feeding import phase_steps as phases
from support.sim import enginesim

START = ["launching", "loading_weights", "allocating_memory", "warming_up", "serving"]


def test_a_dynamo_vllm_worker_serves_once_its_model_is_registered() -> None:
    assert phases("dynamo-vllm", t.dynamo_vllm_healthy()) == START
    snap = fed("dynamo-vllm", t.dynamo_vllm_healthy()).snapshot()
    assert snap.launches == 1 and snap.events["fatal"] == 0 and (snap.shards_loaded, snap.shards_expected) == (8, 8)


def test_a_dynamo_vllm_worker_that_stops_at_its_shards_is_loading_weights() -> None:
    assert fed("dynamo-vllm", t.dynamo_vllm_until_shards()).snapshot().phase == "loading_weights"


def test_a_dead_engine_behind_a_dynamo_vllm_worker_is_failed() -> None:
    """`VllmEngineMonitor` on `EngineDeadError`: it logs and exits 1."""
    died = t._dyn("10:00:00", "engine_monitor._check_engine_health", "vLLM AsyncLLM health check failed: "
                  "EngineCore encountered an issue. See stack trace (above) for the root cause.", level="ERROR")
    snap = fed("dynamo-vllm", t.dynamo_vllm_healthy(), died).snapshot()
    assert snap.phase == "failed" and snap.events["fatal"] >= 1


def test_a_dynamo_workers_stop_is_a_stop() -> None:
    interpreter = fed("dynamo-vllm", t.dynamo_vllm_healthy(), t.dynamo_stop())
    assert interpreter.snapshot().stop_requested
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "stopped"


@pytest.mark.parametrize(("name", "banner"), [
    # SGLang's banner, printed when the worker builds `sgl.Engine` after its signal handlers.
    ("dynamo-sglang", t._dyn("09:00:02", "engine._launch_subprocesses", "server_args=ServerArgs(model_path='deepseek-"
                             "ai/DeepSeek-R1-Distill-Llama-8B', tp_size=1)")),
    # TensorRT-LLM's, printed at its import, before them.
    ("dynamo-trtllm", "[TensorRT-LLM] TensorRT-LLM version: 1.1.0rc3\n"),
])
def test_the_engines_banner_inside_a_worker_is_no_second_launch(name: str, banner: str) -> None:
    """One launch, begun by the worker's banner: the engine's own banner in the worker's process is neither a
    restart nor where a restarted exporter replays the log from (that would skip the worker's lines before it)."""
    handlers = t.dynamo_vllm_until_shards().split("\n", 1)[0] + "\n"
    registered = t._dyn("09:05:00", "_core", "Registered base model 'm' MDC")
    interpreter = LogInterpreter(ENGINES[name])
    assert interpreter.has_launch(handlers.encode()) and not interpreter.has_launch(banner.encode())
    for text in ((banner + handlers), (handlers + banner)):
        snap = fed(name, text, registered).snapshot()
        assert snap.launches == 1 and snap.events["server_restart"] == 0, text
        assert snap.phase == "serving"


def test_a_dynamo_sglang_worker_reads_sglangs_messages_in_dynamos_format() -> None:
    """The lines of a published Dynamo SGLang worker (2026-07-08)."""
    lines = (t.dynamo_vllm_until_shards().split("\n", 1)[0] + "\n"
             + t._dyn("09:00:05", "model_runner.load_model", "Load weight begin. avail mem=93.17 GB")
             + t._dyn("09:00:40", "model_runner.load_model", "Load weight end. elapsed=35.02 s, type=Qwen3MoeForCausal"
                      "LM, avail mem=61.65 GB, mem usage=31.52 GB.")
             + t._dyn("09:00:41", "model_runner.init_memory_pool", "KV Cache is allocated. #tokens: 342588")
             + t._dyn("09:01:20", "_core", "Registered base model 'Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8' MDC")
             + t._dyn("09:01:20", "register.register_model_with_readiness_gate", "Model registration succeeded; "
                      "processing queued requests"))
    assert phases("dynamo-sglang", lines) == ["launching", "loading_weights", "allocating_memory", "serving"]


def test_aphrodite_goes_through_vllms_phases_in_its_own_format() -> None:
    assert phases("aphrodite-vllm", t.aphrodite_healthy()) == START
    snap = fed("aphrodite-vllm", t.aphrodite_healthy()).snapshot()
    assert snap.launches == 1 and snap.events["fatal"] == 0 and (snap.shards_loaded, snap.shards_expected) == (5, 5)
    assert fed("aphrodite-vllm", t.aphrodite_until_shards()).snapshot().phase == "loading_weights"


def test_aphrodites_stop_is_a_stop() -> None:
    interpreter = fed("aphrodite-vllm", t.aphrodite_healthy(), t.aphrodite_stop())
    assert interpreter.snapshot().stop_requested
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "stopped"


def test_aphrodites_page_and_stats_line_are_its_figures() -> None:
    spec = ENGINES["aphrodite-vllm"].metrics
    assert spec is not None
    work = enginesim.Work("aphrodite-vllm", {"running": 2, "waiting": 1, "tokens_start": 900})
    assert parse_page(work.page(), spec) == (2.0, 1.0, 900.0)
    line = enginesim._aphrodite_stats("09:05:00", 0, 2, 1, 31.5, 1).encode()
    assert last_stats(line, ENGINES["aphrodite-vllm"].stats_lines[0]) == {b"": (2, 1, 31.5)}


def test_an_xinference_model_process_serves_once_its_actor_says_loaded() -> None:
    """The vLLM inside prints its engine's lines through the actor's logger; the actor's `loaded` is ready; a model
    process gone without a failure was terminated by its worker."""
    lines = t.xinference_model_loaded()
    assert phases("xinference", lines) == ["launching", "loading_weights", "allocating_memory", "serving"]
    oom = ("2026-11-20 09:31:02,331 xinference.core.model 4242 ERROR    Model actor is out of memory, model id: "
           "qwen2.5-instruct, error: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    failed = fed("xinference", lines, oom)
    failed.process_gone()
    assert (failed.snapshot().phase, failed.snapshot().stop_requested) == ("failed", False)
    assert failed.snapshot().events["oom"] >= 1
    # Its worker ends a terminated model's process without a line: a stop, not an outage (`exit_is_stop`).
    unloaded = fed("xinference", lines)
    unloaded.process_gone()
    assert (unloaded.snapshot().phase, unloaded.snapshot().stop_requested) == ("stopped", True)
    vllm = fed("vllm", t.vllm_healthy(tp=1))
    vllm.process_gone()
    assert (vllm.snapshot().phase, vllm.snapshot().stop_requested) == ("stopped", False)


@pytest.mark.parametrize(("bar", "shards"), [
    # transformers' bar (`tests/fixtures/logs/xinference-1.6.0-transformers-launch-loaded.log`): it read no shards.
    ("Loading checkpoint shards: 100%|█████████████| 2/2 [00:10<00:00,  5.11s/it]", (2, 2)),
    ("Loading safetensors checkpoint shards:  50% Completed | 4/8 [00:04<00:04,  1.02s/it]", (4, 8)),
], ids=["transformers", "vllm"])
def test_an_xinference_model_process_counts_its_engines_weight_shards(bar: str, shards: tuple[int, int]) -> None:
    """Whichever engine the model process hosts, its weights bar is the model's shards: vLLM's, and transformers'
    in tqdm's default format. Neither was counted (the Xinference engine had no shards pattern)."""
    snap = fed("xinference", bar + "\n").snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == shards


def test_a_dynamo_sglang_workers_decode_lines_are_its_figures() -> None:
    """SGLang's decode stats line in Dynamo's format (no `[time TPn]`): running, waiting and its throughput."""
    line = t._dyn("09:10:00", "scheduler_metrics_mixin.report_decode_stats", "Decode batch, #running-req: 7, #token: "
                  "4096, token usage: 0.03, cuda graph: True, gen throughput (token/s): 412.50, #queue-req: 2")
    assert last_stats(line.encode(), ENGINES["dynamo-sglang"].stats_lines[0]) == {b"": (7, 2, 412.5)}
