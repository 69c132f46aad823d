"""The corpus of real logs (`tests/fixtures/logs/`, pinned in `SOURCES.md`), each read as an expert reads it
(`readings.yml`): replayed line by line through the engine's interpreter after its process was found, and, where the
log ends with its process, after the process is gone. Prints one row per log; every row must match."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from support.corpus import LOGS, READINGS, Reading, reading, replay


@pytest.mark.parametrize("reading", READINGS, ids=[r.file for r in READINGS])
def test_each_real_log_reads_as_the_expert_reads_it(reading: Reading) -> None:
    got = replay(reading)
    print(f"\n{reading.row(got)}")
    assert got.matches(reading), reading.row(got)


@pytest.mark.parametrize("reading", READINGS, ids=[r.file for r in READINGS])
def test_each_real_log_counts_the_same_events_in_one_block_as_line_by_line(reading: Reading) -> None:
    """What is counted does not depend on how the follower's reads cut the log (a busy machine reads it in a few
    large blocks, a quiet one a line at a time): `Scheduler hit an exception: Traceback ...` is one fatal line
    whether its traceback ends in the same block or a later one (it counted twice when read line by line)."""
    assert replay(reading, whole=True).counts == replay(reading).counts


def test_the_corpus_is_pinned_and_spread() -> None:
    """Every file of the corpus has a reading and a row in SOURCES.md, and every reading its file."""
    folder = Path(READINGS[0].path).parent
    files = {p.name for p in folder.glob("*.log")}
    assert files == {r.file for r in READINGS}
    sources = (folder / "SOURCES.md").read_text()
    assert [f for f in sorted(files) if f"`{f}`" not in sources] == []


@pytest.mark.parametrize("file", ["vllm-0.22.0-sleep-wakeup-oom-survives.log",
                                  "vllm-0.19.1-oom-during-graph-capture-offline.log",
                                  "vllm-0.14.0-rocm-hip-oom-in-compile-wrapper.log",
                                  "tgi-2x-k8s-2shard-oom-load-llama3-70b.log"])
def test_out_of_memory_in_each_allocators_words_is_oom(file: str) -> None:
    """vLLM's cumem allocator (`CUDA Error: out of memory at ...`), the CUDA runtime's `CUDA error: out of memory`
    as `torch.AcceleratorError`, PyTorch's `HIP out of memory` on ROCm and its `torch.cuda.OutOfMemoryError`."""
    assert "oom" in replay(reading(file)).events


def test_a_prompt_that_says_out_of_memory_is_no_oom() -> None:
    """The counter-test: a request's logged prompt that happens to say `runs out of memory`."""
    assert "oom" not in replay(reading("vllm-0.10.0-prompt-text-says-out-of-memory.log")).events


@pytest.mark.parametrize("file", ["llamacpp-b5760-metal-dir-not-file-load-fail.log",
                                  "llamacpp-b8248-docker-unknown-arch-gemma4-exit0.log"])
def test_a_llamacpp_load_failure_stays_failed_through_its_cleanup_line(file: str) -> None:
    """llama.cpp prints `cleaning up before exit...` on every exit, also after `failed to read magic` or an
    unknown architecture and before `exiting due to model loading error`: the launch stays failed."""
    seen = replay(reading(file))
    assert seen.phase == "failed" and "fatal" in seen.events


def test_a_llamacpp_stop_after_ready_is_stopped() -> None:
    """The counter-test: the same cleanup line after a Ctrl-C while serving is the stop."""
    seen = replay(reading("llamacpp-b9090-metal-stop-after-ready-membreakdown.log"))
    assert seen.phase == "stopped" and "fatal" not in seen.events


def test_a_wrappers_line_that_names_vllm_does_not_move_the_phase() -> None:
    """A deploy script's own `Starting vLLM server...` (its logger's `- __main__ - INFO -` prefix), before vLLM's
    banner in the same file, is not vLLM's: the launch stays `launching`. The counter-test: vLLM's own line, with
    its logger's prefix, is the API server starting."""
    interpreter = LogInterpreter(ENGINES["vllm"])
    interpreter.process_started(0.0)
    lines = (LOGS / "vllm-0.9.1-wrapper-two-launches-fail.log").read_bytes().splitlines(keepends=True)
    for line in lines[:9]:  # the wrapper's lines, up to its "Waiting for server to be ready..."
        interpreter.feed(line)
    assert interpreter.snapshot().phase == "launching"
    interpreter.feed(b"INFO 08-16 02:17:54 [api_server.py:1818] Starting vLLM API server 0 on http://0.0.0.0:8011\n")
    assert interpreter.snapshot().phase == "warming_up"


def test_ollamas_gpu_discovery_runner_is_no_load_and_its_model_runner_is() -> None:
    """An Ollama 0.13 start: the GPU discovery's runner (no `--model`) leaves the server serving; the runner started
    for a model 38 s later is that model's load, to its ready line."""
    interpreter = LogInterpreter(ENGINES["ollama"])
    interpreter.process_started(0.0)
    lines = (LOGS / "ollama-0.13.0-cpu-discovery-runner-then-model-load.log").read_bytes().splitlines(True)
    model_runner = next(i for i, line in enumerate(lines) if b'"starting runner"' in line and b" --model " in line)
    for line in lines[:model_runner]:
        interpreter.feed(line)
    assert interpreter.snapshot().timeline == ("launching", "serving")
    interpreter.feed(lines[model_runner])
    assert interpreter.snapshot().phase == "loading_weights"
    for line in lines[model_runner + 1:]:
        interpreter.feed(line)
    assert interpreter.snapshot().timeline == ("launching", "serving", "loading_weights", "serving")
