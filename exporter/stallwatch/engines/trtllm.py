"""TensorRT-LLM `trtllm-serve` (its OpenAI server, PyTorch and TensorRT backends), strings as in NVIDIA/TensorRT-LLM:
`tensorrt_llm/commands/serve.py` at 00209af1 (the command, host `localhost`, port 8000), `tensorrt_llm/serve/
openai_server.py` at 00057725 (routes, `/health`, `/prometheus/metrics`), `tensorrt_llm/__init__.py` (the banner),
`tensorrt_llm/_torch/models/modeling_utils.py` (the weights bar), `tensorrt_llm/executor/worker.py` and `proxy.py`,
`cpp/tensorrt_llm/runtime/ipcNvlsMemory.cu` at 9e9a4afe, and the lines of published logs (issues #7703, #14500,
PR #5291, NVIDIA/Model-Optimizer#1933). Its HTTP server is uvicorn (`uvicorn/lifespan/on.py`, `uvicorn/server.py`).

Not covered: `trtllm-serve disaggregated` (`OpenAIDisaggServer`, a router in front of context and generation servers
that holds no model and no GPU: its health is its workers'), `grpc` (no HTTP `/health`), `mm_embedding_serve` and
the internal `disaggregated_mpi_worker`; Triton's TensorRT-LLM backend (`tritonserver`) is another program."""

import re

from stallwatch.engines.base import MPI_RANK_DIED, Engine, MetricsSpec, heartbeats, rule

ENGINE = Engine(
    name="trtllm",
    # `trtllm-serve MODEL` runs `serve` too (`commands/serve.py` `DefaultGroup.resolve_command`: a first argument
    # that is no sub-command is the model). Its other sub-commands are not this server (see the module's doc).
    program=re.compile(r"(?:\S*/)?trtllm-serve(?!\s+(?:disaggregated|disaggregated_mpi_worker|grpc|"
                       r"mm_embedding_serve)(?:\s|$))(?:\s|$)"),
    default_port=8000,
    # `--host` defaults to `localhost` (`commands/serve.py`), which binds the IPv4 loopback.
    default_host="127.0.0.1",
    model_commands=("serve", "trtllm-serve"),
    tp_flags=("--tp_size",),
    # `/health` (`openai_server.py` `health`) answers 200 while `_check_health()` finds the executor alive, else 503
    # `LLM is unavailable. Please check the server logs for more details.`; the port is bound but not listening
    # until the LLM is built (`serve.py` `launch_server`).
    # `/metrics` is the executor's iteration stats as JSON (`get_iteration_stats`), never the text format: the text
    # format is at `/prometheus/metrics` (`mount_metrics`), mounted only with `return_perf_metrics: true` in the LLM
    # options (a YAML file, `--extra_llm_api_options`), FastAPI's 404 otherwise. Names from `tensorrt_llm/metrics/
    # collector.py` (labels `model_name`, `engine_type`), as llm-d's `factories.go` reads them.
    metrics=MetricsSpec(running="trtllm_num_requests_running", waiting="trtllm_num_requests_waiting",
                        tokens="trtllm_generation_tokens_total", path="/prometheus/metrics", absent_status=(404,)),
    # The Python logger's `[06/28/2025-17:32:17] [TRT-LLM] [I] ` (`[TRT-LLM] [RANK 0] [I] ` on a rank, then a
    # component's `[executor] `: `tensorrt_llm/logger.py`); the C++ runtime's `[TensorRT-LLM][INFO] ` is a
    # message's own start.
    line_prefix=rb"(?:\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\] \[TRT-LLM\] (?:\[RANK \d+\] )?\[[A-Z]\] (?:\[[a-z_]+\] )?)?",
    # uvicorn's access log is on (`openai_server.py` `__call__`: `uvicorn.Config(..., log_level="info")`): every poll
    # of a page prints `INFO:     127.0.0.1:40312 - "GET /health HTTP/1.1" 200 OK` (`uvicorn/logging.py`
    # `AccessFormatter`), stallwatch's own probes and fetches among them. They say nothing of the engine: no progress.
    heartbeats=heartbeats(r'INFO: +\S+ - "GET /(?:health|metrics|prometheus/metrics|v1/models|version)(?:\?\S*)? '
                          r'HTTP/[\d.]+" \d+'),
    # The PyTorch backend's weights bar (`_torch/models/modeling_utils.py`, tqdm): `Loading weights concurrently:
    # 63%|██████▎ | 703/1113` (#7703), `Loading weights: 100%|...| 1190/1190` (PR #5291); without a terminal
    # `Loading weights concurrently: 100% 45/45 [...]`. It counts modules, not checkpoint files.
    shards=re.compile(rb"Loading weights(?: concurrently)?: *\d+%(?:\|[^|\n\r]*\|)? +(\d+)/(\d+)"),
    rules=(
        # The banner, printed at `import tensorrt_llm` (`tensorrt_llm/__init__.py`): `[TensorRT-LLM] TensorRT-LLM
        # version: 0.20.0rc3`, `TensorRT LLM version: 1.3.0rc0` since 1.3. The MPI workers the LLM spawns import it
        # too, before the weights: still launching, one launch.
        rule(r"\[TensorRT-LLM\] TensorRT[- ]LLM version: ", phase="launching", launch=True),
        # The checkpoint files' prefetch bar (PR #5291: `Loading safetensors weights in parallel: 100%|...| 1/1`),
        # and the TensorRT backend's engine (`[TensorRT-LLM][INFO] Loaded engine size: 15323 MiB`, NVIDIA/nim-deploy
        # #24).
        rule(r"Loading safetensors weights in parallel|\[TensorRT-LLM\]\[INFO\] Loaded engine size: ",
             phase="loading_weights"),
        # After the weights (`Model init total -- 49.14s`, each rank's, in published 1.x logs), the KV cache:
        # `[TensorRT-LLM][INFO] [MemUsageChange] Allocated 59.50 GiB for max tokens in paged KV cache (6931712).`
        # (1.x), `Max tokens in paged KV cache: 38400. Allocating 5033164800 bytes.` (nim-deploy #24), `Allocate
        # 7616856064 bytes for k/v cache.` (triton-inference-server/tensorrtllm_backend #377).
        rule(r"Model init total -- |[Mm]ax tokens in paged KV cache|Allocate \d+ bytes for k/v cache",
             phase="allocating_memory"),
        # uvicorn's lifespan (`uvicorn/lifespan/on.py`) once `OpenAIServer`'s startup ran: the LLM is built.
        rule(r"INFO: +Application startup complete\.", phase="serving"),
        # A stop: uvicorn's `Shutting down` on SIGTERM or SIGINT (`uvicorn/server.py`), and the disaggregated leader's
        # handler (`serve.py` `_signal_handler_cleanup_child`: `Parent process (PID p) received signal SIGTERM.
        # Terminating child process (PID c).`). uvicorn's `Finished server process` follows every exit: no stop.
        rule(r"INFO: +Shutting down\r?$|Parent process \(PID \d+\) received signal SIG[A-Z]+\. Terminating child "
             r"process", stop=True),
        # The executor dies behind a live HTTP server: a rank under MPI (Open MPI's lines, which COMMON_RULES count as
        # events only; the executor's workers run under MPI, `MpiPoolSession` or `mpirun ... trtllm-llmapi-launch
        # trtllm-serve`), and `/health` turns 503 or stays 200 until the proxy notices; or the executor's error in a
        # request (`openai_server.py`: `except CppExecutorError:` logs the traceback and raises SIGINT on itself,
        # whose `Shutting down` is then no stop). Either way the server is dead while uvicorn answers: failed, also
        # once serving.
        rule(MPI_RANK_DIED, phase="failed", event="fatal"),
        rule(r"\bCppExecutorError\b", phase="failed", event="fatal"),
        # The executor's workers that do not start (`executor/worker.py` `worker_main`: `Failed to initialize executor
        # on rank 0: ...`, `Executor worker initialization error: Traceback ...`; `executor/proxy.py`
        # `_start_executor_workers`: `RuntimeError: Executor worker returned error`; NVIDIA/Model-Optimizer#1933).
        rule(r"Failed to initialize executor on rank \d+|Executor worker (?:initialization error|returned error)",
             phase="failed", event="fatal"),
        # The C++ runtime's errors (`[TensorRT-LLM][ERROR] ...`): fatal before serving; once serving one request's
        # error prints them too. `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED not supported on GPU0.` is printed at every
        # start on a GPU without multicast (an H100 PCIe; `ipcNvlsMemory.cu` `ipcNvlsSupported`, `TLLM_LOG_ERROR` in 1.x
        # builds, DEBUG in later sources) and is no failure.
        rule(r"\[TensorRT-LLM\]\[ERROR\] (?!CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED not supported)", event="fatal",
             serving=False),
    ),
)
