"""TensorRT-LLM's `trtllm-serve` as data: which processes are it, where it listens, what its log lines mean (its
executor's death behind a live HTTP server above all), and that its JSON `/metrics` is never read as figures."""

from __future__ import annotations

import time

import pytest

from stallwatch.discovery.processes import invocation
from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.signals.engine_page import parse_page
from support import feeding
from support import transcripts as t

TRTLLM = ENGINES["trtllm"]


def fed(*texts: str, interpreter: LogInterpreter | None = None) -> LogInterpreter:
    return feeding.fed("trtllm", *texts, interpreter=interpreter)


@pytest.mark.parametrize(("argv", "found"), [
    (["/usr/local/bin/trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct"], True),
    (["/usr/local/bin/trtllm-serve", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--tp_size", "8"], True),
    (["/usr/bin/python3", "/usr/local/bin/trtllm-serve", "serve", "/models/llama"], True),
    (["trtllm-serve", "--host", "0.0.0.0", "/models/llama"], True),
    # A router in front of other servers, and the commands that are no HTTP LLM server (see the engine module).
    (["/usr/local/bin/trtllm-serve", "disaggregated", "-c", "disagg.yaml"], False),
    (["python3", "/usr/local/bin/trtllm-serve", "disaggregated_mpi_worker", "-c", "disagg.yaml"], False),
    (["trtllm-serve", "grpc", "/models/llama"], False),
    (["trtllm-serve", "mm_embedding_serve", "/models/qwen-vl"], False),
    (["trtllm-serve-wrapper", "/models/llama"], False),
    (["trtllm-llmapi-launch", "trtllm-serve", "/models/llama"], False),  # the launcher runs it: its child is it
])
def test_trtllm_serve_is_found_and_its_other_commands_are_not(argv: list[str], found: bool) -> None:
    assert TRTLLM.program is not None
    assert (TRTLLM.program.match(invocation(argv)) is not None) is found


@pytest.mark.parametrize(("argv", "address", "model", "tp"), [
    (["trtllm-serve", "/models/Llama-3.1-8B"], ("127.0.0.1", 8000), "/models/Llama-3.1-8B", ""),
    (["trtllm-serve", "serve", "nvidia/DeepSeek-R1-FP4", "--host", "0.0.0.0", "--port", "26666", "--tp_size", "8"],
     ("0.0.0.0", 26666), "nvidia/DeepSeek-R1-FP4", "8"),
    (["python3", "/usr/local/bin/trtllm-serve", "serve", "Qwen/Qwen3-8B", "--port=9000"],
     ("127.0.0.1", 9000), "Qwen/Qwen3-8B", ""),
])
def test_address_model_and_tensor_parallel_from_the_command_line(argv: list[str], address: tuple[str, int],
                                                                 model: str, tp: str) -> None:
    assert TRTLLM.listen_address(argv) == address
    assert TRTLLM.model(argv) == model
    assert TRTLLM.tensor_parallel(argv) == tp


def test_vllm_still_reads_its_model_after_serve() -> None:
    assert ENGINES["vllm"].model(["/usr/bin/vllm", "serve", "meta-llama/Llama-3.1-70B", "--port", "8000"]) == \
        "meta-llama/Llama-3.1-70B"


def test_a_healthy_start_goes_through_the_phases_without_a_fatal() -> None:
    """The multicast error every start on an H100 PCIe prints is no failure; the weights bar is the shards."""
    seen = []
    interpreter = LogInterpreter(TRTLLM)
    for line in t.trtllm_healthy().splitlines(keepends=True):
        fed(line, interpreter=interpreter)
        if interpreter.snapshot().phase != (seen or [None])[-1]:
            seen.append(interpreter.snapshot().phase)
    snap = interpreter.snapshot()
    assert seen == ["launching", "loading_weights", "allocating_memory", "serving"]
    assert (snap.shards_loaded, snap.shards_expected) == (1113, 1113)
    assert snap.events["fatal"] == 0 and snap.launches == 1


def test_a_frozen_weights_bar_is_loading_weights_where_it_stopped() -> None:
    snap = fed(t.trtllm_until_weights(modules=1113, upto=703)).snapshot()
    assert snap.phase == "loading_weights" and (snap.shards_loaded, snap.shards_expected) == (703, 1113)


@pytest.mark.parametrize(("bar", "progress"), [
    ("Loading weights concurrently: 63%|██████▎   | 703/1113 [01:02<00:38, 10.7it/s]\n", (703, 1113)),  # #7703
    ("Loading weights concurrently:   0%|          | 0/1288 [00:00<?, ?it/s]\n", (0, 1288)),  # #14500
    ("Loading weights: 100%|██████████| 1190/1190 [01:01<00:00, 19.26it/s]\n", (1190, 1190)),  # PR #5291
    ("Loading weights concurrently: 100% 45/45 [00:01<00:00, 35.06it/s]\n", (45, 45)),  # no terminal (1.3.0rc0)
])
def test_the_weights_bar_in_each_real_shape(bar: str, progress: tuple[int, int]) -> None:
    snap = fed(t.trtllm_until_weights(modules=10, upto=0), bar).snapshot()
    assert snap.phase == "loading_weights"
    assert (snap.shards_loaded, snap.shards_expected) == progress


@pytest.mark.parametrize("line", [
    "[TensorRT-LLM] TensorRT-LLM version: 0.20.0rc3\n",
    "[TensorRT-LLM] TensorRT LLM version: 1.3.0rc0\n",
])
def test_each_banner_starts_a_launch(line: str) -> None:
    interpreter = LogInterpreter(TRTLLM)
    assert interpreter.has_launch(line.encode())
    assert fed(line, interpreter=interpreter).snapshot().phase == "launching"


@pytest.mark.parametrize("line", [
    "[TensorRT-LLM][INFO] Max tokens in paged KV cache: 38400. Allocating 5033164800 bytes.\n",
    "[TensorRT-LLM][INFO] Allocate 7616856064 bytes for k/v cache.\n",
    "[TensorRT-LLM][INFO] [MemUsageChange] Allocated 26.91 GiB for max tokens in paged KV cache (220480).\n",
])
def test_each_kv_cache_line_is_allocating_memory(line: str) -> None:
    snap = fed(t.trtllm_until_weights(), line).snapshot()
    assert snap.phase == "allocating_memory"


@pytest.mark.parametrize("death", [
    t.trtllm_executor_died(),
    "Primary job  terminated normally, but 1 process returned\n",
    "[11/20/2026-09:40:02] [TRT-LLM] [E] Traceback (most recent call last):\n  File \"openai_server.py\", line 640\n"
    "tensorrt_llm.executor.utils.CppExecutorError: Executor is shut down\n",
])
def test_the_executors_death_while_uvicorn_serves_is_failed(death: str) -> None:
    """Open MPI's lines of a dead rank, or the executor's error that makes the server SIGINT itself: the server is
    dead while its HTTP server answers, so failed, not serving."""
    snap = fed(t.trtllm_healthy(), death).snapshot()
    assert snap.phase == "failed" and snap.events["fatal"] >= 1


def test_a_health_probe_that_still_answers_does_not_undo_the_failure() -> None:
    """`/health` stays 200 until the proxy notices the dead executor: the probe does not make it serving again;
    a new launch does."""
    interpreter = fed(t.trtllm_healthy(), t.trtllm_executor_died())
    interpreter.probe_succeeded(time.time() + 5)
    assert interpreter.snapshot().phase == "failed"
    fed(t.trtllm_healthy(), interpreter=interpreter)
    assert interpreter.snapshot().launches == 2 and interpreter.snapshot().phase == "serving"


def test_a_probe_still_rescues_a_startup_that_did_not_serve_yet() -> None:
    interpreter = fed(t.trtllm_until_weights(), "[TensorRT-LLM][ERROR] Assertion failed: tmp.size() > 0\n")
    interpreter.probe_succeeded(time.time() + 5)
    assert interpreter.snapshot().phase == "serving"


def test_a_requests_error_while_serving_is_not_fatal() -> None:
    """One request's traceback, and a C++ error line, once serving: the server goes on."""
    snap = fed(t.trtllm_healthy(), t.trtllm_request_error(),
               "[TensorRT-LLM][ERROR] Encountered an error for request 2048\n").snapshot()
    assert snap.phase == "serving" and snap.events["fatal"] == 0


@pytest.mark.parametrize("failure", [
    "[07/07/2026-03:31:36] [TRT-LLM] [E] [executor] Failed to initialize executor on rank 0: tuple index out of "
    "range\n",
    "RuntimeError: Executor worker returned error\n",
])
def test_an_executor_that_does_not_start_is_failed(failure: str) -> None:
    snap = fed(t.trtllm_until_weights(), failure).snapshot()
    assert snap.phase == "failed" and snap.events["fatal"] == 1


def test_a_startup_error_then_exit_is_failed() -> None:
    interpreter = fed(t.trtllm_until_weights(), "[TensorRT-LLM][ERROR] Assertion failed: tmp.size() > 0\n")
    assert interpreter.snapshot().events["fatal"] == 1
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "failed"


@pytest.mark.parametrize("stop", [
    t.trtllm_stop(),
    "[11/20/2026-09:50:00] [TRT-LLM] [I] Parent process (PID 4242) received signal SIGTERM. Terminating child "
    "process (PID 4250).\n",
])
def test_a_stop_ends_stopped_and_says_it_was_asked(stop: str) -> None:
    interpreter = fed(t.trtllm_healthy(), stop)
    assert interpreter.snapshot().stop_requested
    interpreter.process_gone()
    snap = interpreter.snapshot()
    assert snap.phase == "stopped" and snap.events["fatal"] == 0


def test_shutting_down_after_the_executor_died_is_no_stop() -> None:
    """The executor's error makes the server SIGINT itself: uvicorn's `Shutting down` then is the failure's end."""
    interpreter = fed(t.trtllm_healthy(), "tensorrt_llm.executor.utils.CppExecutorError: Executor is shut down\n",
                      t.trtllm_stop())
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "failed"


TEXT_PAGE = (
    "# HELP trtllm_num_requests_running Number of requests currently running.\n"
    "# TYPE trtllm_num_requests_running gauge\n"
    'trtllm_num_requests_running{engine_type="undefined",model_name="undefined"} 3.0\n'
    "# TYPE trtllm_num_requests_waiting gauge\n"
    'trtllm_num_requests_waiting{engine_type="undefined",model_name="undefined"} 1.0\n'
    "# TYPE trtllm_generation_tokens counter\n"
    'trtllm_generation_tokens_total{engine_type="undefined",model_name="undefined"} 52311.0\n'
    'trtllm_generation_tokens_created{engine_type="undefined",model_name="undefined"} 1.7635e+09\n'
)

# `/metrics`: the executor's iteration stats (`openai_server.py` `get_iteration_stats`), JSON.
JSON_PAGE = (
    '[{"cpuMemUsage": 0, "gpuMemUsage": 68719476736, "iter": 1187, "iterLatencyMS": 21.4, '
    '"numActiveRequests": 3, "numQueuedRequests": 1, "numCompletedRequests": 2, '
    '"kvCacheStats": {"usedNumBlocks": 128, "freeNumBlocks": 216488}, '
    '"trtllm_num_requests_running": 3, "trtllm_generation_tokens_total": 52311}]'
)


def test_its_prometheus_page_is_read_from_its_own_path() -> None:
    spec = TRTLLM.metrics
    assert spec is not None and spec.path == "/prometheus/metrics" and spec.served(["trtllm-serve", "m"])
    assert parse_page(TEXT_PAGE, spec) == (3.0, 1.0, 52311.0)


@pytest.mark.parametrize("body", [JSON_PAGE, JSON_PAGE.replace(", ", ",\n"), '{"detail":"Not Found"}'])
def test_a_json_page_is_no_figures(body: str) -> None:
    """Its JSON `/metrics`, even one that names the families as keys on lines of their own, or FastAPI's 404 body:
    a page without samples, never numbers read out of it."""
    spec = TRTLLM.metrics
    assert spec is not None
    with pytest.raises(ValueError, match="no samples"):
        parse_page(body, spec)


def test_the_polls_of_its_pages_in_uvicorns_access_log_are_no_progress() -> None:
    """Every probe and page fetch prints an access line: a server that does nothing else shows no progress; a
    request that generates does."""
    clock = iter(range(100, 200))
    interpreter = LogInterpreter(TRTLLM, wall=lambda: float(next(clock)))
    for path in ("/health", "/prometheus/metrics", "/metrics", "/v1/models"):
        interpreter.feed(f'INFO:     127.0.0.1:40312 - "GET {path} HTTP/1.1" 200 OK\n'.encode())
    assert interpreter.snapshot().progress is None
    interpreter.feed(b'INFO:     10.0.3.7:51432 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    assert interpreter.snapshot().progress is not None
