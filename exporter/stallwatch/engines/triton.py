"""NVIDIA Triton Inference Server (`tritonserver`), as it serves TensorRT-LLM engines through its TensorRT-LLM backend;
strings as in triton-inference-server/server at e1db8a60 (2026-08, `src/main.cc`, `src/http_server.cc`,
`src/grpc/grpc_server.cc`, `src/triton_signal.cc`, `src/common.h`, `src/command_line_parser.cc`), triton-inference-
server/core at 73aad7c3 (2026-06, `src/server.cc`, `src/model_repository_manager/model_lifecycle.cc`) and common at
83adf7cf (`src/logging.cc`), the TensorRT-LLM backend at c2e65b88 (`scripts/launch_triton_server.py`,
`inflight_batcher_llm/src/`), and published logs (zhjunqin/LLM-Learning's Triton 2.42 start, server#7950,
tensorrtllm_backend#572 and #149).

Triton loads every model of its repository before it opens a port (`main.cc:515-537`: `TRITONSERVER_ServerNew`, then
`StartEndpoints`): while TensorRT-LLM deserializes its engine and allocates its KV cache, 8000 refuses, and a load that
hangs there (tensorrtllm_backend#377, after `Allocate ... bytes for k/v cache`) is the seed stall. `/v2/health/ready`
then answers 200 while every model is READY, 400 otherwise, 503 while it exits (`http_server.cc:1412-1433`,
`core/src/server.cc:396-421`). Its own log lines are glog's (`common/src/logging.cc:127-144`: `I0505 03:10:14.919963
4734 model_lifecycle.cc:461] loading: tensorrt_llm:1`), the message JSON-quoted since 24.06 (`"loading:
tensorrt_llm:1"`, common c4f730fa); the signal line, the fatal `error: creating server: ...`, the model tables and
TensorRT-LLM's own `[TensorRT-LLM][INFO] ...` lines have no such prefix.

The launcher (`launch_triton_server.py` `get_cmd`) runs one `tritonserver` per rank under `mpirun --allow-run-as-root
-n 1 tritonserver --model-repository=... : -n 1 ...` (mpirun runs itself, as any launcher), and only rank 0 opens its
ports (`model_instance_state.cc:844-856`: the other ranks never return from their instance's init): rank 0 is the
server, and the ranks above 0 (their `OMPI_COMM_WORLD_RANK`, read as root) are no servers of their own: they are in
rank 0's tree as `rank1`, ... (mpirun's other children, `Server`), so their GPU memory and CPU are the server's.

Its figures are on its metrics port (8002, `--metrics-port`, off with `--allow-metrics=false`; core `src/metrics.cc`
at 73aad7c3, prometheus-cpp's text format), where the TensorRT-LLM backend writes the executor's iteration stats
(`inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc` and `model_instance_state.cc` at
c2e65b88, the backend's README's example page), from the last iteration: requests `scheduled` and `waiting` (the
backend's active less scheduled, so the two add up to the executor's active requests), and the executor's iteration
counter, a gauge that only moves while it runs iterations. It has no counter of generated tokens (the output-length
histogram moves only as a request completes, minutes apart for long generations): the iteration counter stands in
for it, each iteration a decode step of every request in generation, so a frozen counter with requests held is a hung
executor (NoTokenProgress). An executor that goes idle reports one more iteration with no request left
(NVIDIA/TensorRT-LLM `cpp/tensorrt_llm/executor/executorImpl.cpp` `executionLoop` at 036a60f7: "When there are no
active or inflight requests, we need to update the stats before calling fetchNewRequests"), so an idle server's
figures say 0, not its last batch.

Not covered: the gRPC port; Triton's other backends' own lines."""

import re

from stallwatch.engines.base import MPI_RANK_DIED, Engine, MetricsSpec, rule

ENGINE = Engine(
    name="triton",
    program=re.compile(r"(?:\S*/)?tritonserver(?:\s|$)"),
    # `command_line_parser.h:194-195`: `--http-address` 0.0.0.0, `--http-port` 8000.
    default_port=8000,
    default_host="0.0.0.0",
    port_flags=("--http-port",),
    host_flags=("--http-address",),
    health_path="/v2/health/ready",
    # A Python model's stub (`triton_python_backend_stub`, one per instance: a tokenizer's pre- and postprocessing
    # beside the TensorRT-LLM engine), the server's child.
    role_title=re.compile(r"(?:^|/)(?P<python_backend>triton_python_backend_stub)(?:\s|$)"),
    model_flags=("--model-repository", "--model-store"),
    # `launch_triton_server.py` starts one `tritonserver` per rank under mpirun, all with rank 0's ports: only rank 0
    # serves, the others are its TensorRT-LLM executor's workers.
    rank_env=("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"),
    # `command_line_parser.cc:706-735` and `.h:211-219`: `--allow-metrics` (true), `--metrics-port` (8002), the
    # metrics address that of HTTP; `/metrics` only (`http_server.h:155`; any other path is an empty 200).
    metrics=MetricsSpec(running='nv_trt_llm_request_metrics{request_type="scheduled"}',
                        waiting='nv_trt_llm_request_metrics{request_type="waiting"}',
                        tokens='nv_trt_llm_general_metrics{general_type="iteration_counter"}',
                        port_flags=("--metrics-port",), default_port=8002, switch_flags=("--allow-metrics",),
                        may_lack_figures=True),
    # glog's preamble (`logging.cc:127-144`: level, MMDD, time, pid, `file:line] `), the message's opening quote
    # since 24.06: a traceback's lines are read past it.
    line_prefix=rb'(?:[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.-]+:\d+\] "?)?',
    rules=(
        # A model's load (`model_lifecycle.cc:473` `loading: <model>:<version>`) and TensorRT-LLM's engine
        # (`[TensorRT-LLM][INFO] Loaded engine size: 15319 MiB`).
        rule(r"\] \"?loading: \S+:\d+|\[TensorRT-LLM\]\[INFO\] Loaded engine size: ", phase="loading_weights"),
        # TensorRT-LLM's KV cache: `Allocate 4143972352 bytes for k/v cache.` (0.7-0.8), `[MemUsageChange] Allocated
        # 59.50 GiB for max tokens in paged KV cache (6931712).` (`batch_manager/kvCacheManager.cpp`).
        rule(r"Allocate \d+ bytes for k/v cache|Allocated [\d.]+ GiB for max tokens in paged KV cache|"
             r"[Mm]ax tokens in paged KV cache", phase="allocating_memory"),
        # Every model loaded, the endpoints started (`main.cc:264-322`: gRPC, then HTTP, then metrics):
        # `http_server.cc:4971` `Started HTTPService at 0.0.0.0:8000`.
        rule(r"Started HTTPService at ", phase="serving"),
        # SIGINT or SIGTERM (`triton_signal.cc:112`, on stdout: `Signal (15) received.`), then the models' unload
        # (`core/src/server.cc:312-354`: `Waiting for in-flight requests to complete.`, `Timeout N: Found M live
        # models ...`).
        rule(r"^Signal \((?:2|15)\) received\.", stop=True),
        # A crash (`triton_signal.cc:119-120`: SIGSEGV or SIGABRT, on stderr, then a stack trace), the server that
        # could not be created (`common.h:118-128`: `error: creating server: Internal - failed to load all models`,
        # printed after the whole unload sequence, `tritonserver.cc:2600-2607`), an endpoint that could not start
        # (`main.cc:270-318`), and a rank that died under mpirun (Open MPI's lines; mpirun then ends the job).
        rule(r"^Signal \((?:6|11)\) received\.|^error: creating server: |failed to start (?:GRPC|HTTP|Metrics) "
             r"service: ", phase="failed", event="fatal"),
        rule(MPI_RANK_DIED, phase="failed", event="fatal"),
        # A model that failed to load (`model_lifecycle.cc:654-655`: `failed to load 'tensorrt_llm' version 1:
        # Invalid argument: ...`): with `--exit-on-error` (the default) the server then exits (above); without it,
        # it serves the others.
        rule(r"failed to load '[^']+' version \d+: ", event="fatal"),
    ),
)
