"""vLLM (V0 up to 0.33), strings as in vllm-project/vllm 0.33.0: `vllm/logger.py` (log format),
`vllm/v1/engine/core.py`, `vllm/v1/worker/gpu_model_runner.py`, `vllm/v1/metrics/loggers.py`,
`vllm/entrypoints/openai/api_server.py` and `cli_args.py` (all interfaces, port 8000)."""

import re

from stallwatch.engines.base import (
    CHECKPOINT_SHARDS,
    Disaggregation,
    Engine,
    MetricsSpec,
    MultiNode,
    PendingLine,
    Rendezvous,
    StatsLine,
    heartbeats,
    rule,
)

ENGINE = Engine(
    name="vllm",
    program=re.compile(r"vllm\.entrypoints\.openai\.api_server\b|(?:\S*/)?vllm serve\b"),
    default_port=8000,
    default_host="0.0.0.0",
    role_title=re.compile(r"^VLLM::(?P<role>[A-Za-z0-9_]+)"),
    shards=CHECKPOINT_SHARDS,
    model_flags=("--model",),
    model_commands=("serve",),
    tp_flags=("--tensor-parallel-size", "-tp"),
    # `vllm/v1/metrics/loggers.py` PrometheusStatLogger: gauges and the counter (text format `_total`), one series
    # per DP engine (labels `model_name`, `engine="N"`); always served at `/metrics` on the API port.
    metrics=MetricsSpec(running="vllm:num_requests_running", waiting="vllm:num_requests_waiting",
                        tokens="vllm:generation_tokens_total",
                        # A KV consumer's fetches by stage (`v1/metrics/loggers.py:571-591`) and NIXL's completed
                        # transfers (`kv_connector/v1/nixl/stats.py:188-276`, a histogram).
                        pending=(("prealloc", 'vllm:num_requests_kv_fetch_by_stage{stage="waiting_to_start"}'),
                                 ("transfer", 'vllm:num_requests_kv_fetch_by_stage{stage="in_progress"}')),
                        transfers=("vllm:nixl_xfer_time_seconds_count",)),
    # `--kv-transfer-config '{"kv_connector": "NixlConnector", "kv_role": "kv_producer"}'` or dotted
    # `--kv-transfer-config.kv_role kv_consumer` (`config/kv_transfer.py`); `kv_both` says no role (the NIXL doc:
    # the proxy's lists fix the roles then, `docs/features/nixl_connector_usage.md@026c83f`).
    disaggregation=Disaggregation(json_flags=("--kv-transfer-config",), json_key="kv_role",
                                  role_values=(("kv_producer", "prefill"), ("kv_consumer", "decode")),
                                  member_flags=("--kv-transfer-config",)),
    # The stats line's `KV fetch: {a} waiting to start, {b} in progress, {c} completed waiting` on a KV consumer
    # (`v1/metrics/loggers.py:303-308`; DEBUG while idle, as the line it ends).
    pending_lines=(PendingLine(anchor=b"KV fetch: ", pattern=re.compile(
        rb"(?:Engine (?P<rank>\d+): )?Avg prompt throughput[^\n]*?KV fetch: (?P<prealloc>\d+) waiting to start, "
        rb"(?P<transfer>\d+) in progress"), role="decode"),),
    stats_lines=(
        # `vllm/v1/metrics/loggers.py:276-337` LoggingStatLogger, every VLLM_LOG_STATS_INTERVAL (10 s), DEBUG when
        # idle: `Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s,
        # Running: %d reqs, Waiting: %d reqs, ...` (no `Engine NNN:` before 0.9); V0 (`vllm/engine/metrics.py`):
        # `..., Running: %d reqs, Swapped: %d reqs, Pending: %d reqs, ...`. The throughput is the mean since the
        # previous line, so throughput x interval (at most the 10 s window) is the tokens of that interval.
        StatsLine(anchor=b"Avg generation throughput: ", pattern=re.compile(
            rb"(?:Engine (?P<rank>\d+): )?Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: "
            rb"(?P<throughput>[\d.]+) tokens/s, Running: (?P<running>\d+) reqs, (?:Swapped: \d+ reqs, )?"
            rb"(?:Waiting|Pending): (?P<waiting>\d+) reqs"), max_interval=10.0),
    ),
    # Printed while stuck: the shm ring buffer's notice every 60 s while workers hang
    # (`distributed/device_communicators/shm_broadcast.py:111,761`), and 0.10/0.11's startup handshake notice every
    # 10 s (`v1/engine/utils.py:1449`, `Waiting for %d local, %d remote core engine proc(s) to start.`).
    heartbeats=heartbeats(r"No available shared memory broadcast block found in \d+ seconds",
                          r"Waiting for [\d, a-z]+ core engine proc\(s\) to start"),
    # Over several nodes (`config/parallel.py`, `entrypoints/cli/serve.py`): multi-node TP/PP with `--nnodes`,
    # `--node-rank`, `--master-addr` (port 29501), or data parallel with `--data-parallel-address` (rpc port
    # 29550), `-size`, `-size-local`, `-start-rank`; the nodes other than the head run `--headless`: no API server,
    # no port, no `/metrics`, nothing logged while serving. Their ranks: `VLLM::Worker_TP8`.., `VLLM::EngineCore_DP1`
    # and `VLLM::Worker_DP1_TP0`.. (`v1/executor/multiproc_executor.py`, `v1/engine/core.py`).
    # A child's `(EngineCore_DP0 pid=7) ` (multiprocess workers, Ray's `(RayWorkerWrapper pid=7) `), then its
    # logger's `LEVEL MM-DD HH:MM:SS [file.py:N] ` (`vllm/logger.py`; V0 without the `[`).
    line_prefix=(rb"(?:\(\S+ pid=\d+\) )?"
                 rb"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\] )?"),
    # The writer's pid: `(%(vllm_process_name)s pid=%(process)d) ` (vllm/logger.py:28, 0.33), 0.8-0.9's workers
    # `(VllmWorker rank=0 pid=47465) `, V0's `(VllmWorkerProcess pid=1152873) `; coloured by some 0.11 builds
    # (`\x1b[1;36m(EngineCore_DP0 pid=279)\x1b[0;0m`); the research's engines.md 2.1.
    line_pid=re.compile(rb"(?:\x1b\[[\d;]*m)?\((?:[^()\r\n]* )?pid=(\d{1,10})\)"),
    multinode=MultiNode(
        rendezvous=(Rendezvous(("--data-parallel-address", "-dpa"), ("--data-parallel-rpc-port", "-dpp"), "29550"),
                    Rendezvous(("--master-addr",), ("--master-port",), "29501")),
        rank_role=re.compile(r"^(?:EngineCore|Worker)"),
        nnodes_flags=("--nnodes", "-n"), node_rank_flags=("--node-rank", "-r"),
        dp_size_flags=("--data-parallel-size", "-dp"), dp_local_flags=("--data-parallel-size-local", "-dpl"),
        dp_start_flags=("--data-parallel-start-rank", "-dpr"), headless_flags=("--headless",),
        # A headless node's ready: its local rank 0's load line (`info_once(scope="local")`) for TP/PP workers,
        # which do no more on their own; its engine core's `init engine ... took` for data parallel.
        worker_rules=(rule(r"Model loading took|init engine \(profile, create kv cache, warmup model\) took",
                           phase="serving"),)),
    # vLLM's own lines carry its logger's prefix, `INFO 11-13 09:22:27 [api_server.py:1090] ` (`vllm/logger.py`;
    # V0 without the `[`), and uvicorn's its `INFO:     `: the rules that start a launch or move it towards serving
    # match with it, so that a wrapper script's `Starting vLLM server for <app>...` in the same file is not vLLM's.
    rules=(
        # The API server's banner, once per launch (`entrypoints/common/startup.py`); each DP engine core prints its
        # own `Initializing a V1 LLM engine`.
        rule(r"\] (?:vLLM (?:API )?server version|non-default args:)", phase="launching", launch=True),
        # A headless node's banner (`entrypoints/cli/serve.py`).
        rule(r"Launching vLLM \(v[^)\n]*\) headless multiproc executor|Launching \d+ data parallel engine\(s\) in "
             r"headless mode", phase="launching", launch=True),
        rule(r"Initializing an? (?:V1 )?LLM engine", phase="launching"),
        rule(r"Starting to load model|Loading drafter model|Using model weights format", phase="loading_weights"),
        rule(r"Loading weights took|Model loading took|Memory profiling takes", phase="allocating_memory"),
        # The profile run that sizes the KV cache: torch.compile runs inside its first forward up to 0.16
        # (`Dynamo bytecode transform time`, `Compiling a graph for ...`, `torch.compile takes X s in total`,
        # `compilation/monitor.py`), before it from 0.19 (`torch.compile took`, `Initial profiling/warmup run
        # took`), then `Profiling CUDA graph memory` / `Estimated CUDA graph memory` (0.21+) and the KV cache
        # size; `Capturing CUDA graphs` comes after all of it (`v1/worker/gpu_worker.py`
        # `determine_available_memory`, `v1/engine/core.py` `_initialize_kv_caches`).
        rule(r"Dynamo bytecode transform time|Compiling a graph for|torch\.compile (?:takes|took) [\d.]+ s in total",
             phase="allocating_memory"),
        rule(r"Initial profiling/warmup run took|Profiling CUDA graph memory|Estimated CUDA graph memory",
             phase="allocating_memory"),
        rule(r"Available KV cache memory|KV cache size: [\d,]+ tokens|# GPU blocks:", phase="allocating_memory"),
        rule(r"Capturing CUDA graph(?:s| shapes)|Capturing cudagraphs|Capturing the model for CUDA graphs",
             phase="capturing_graphs"),
        rule(r"Graph capturing finished|init engine \(profile, create kv cache, warmup model\) took",
             phase="warming_up"),
        rule(r"\] (?:Starting vLLM (?:API )?server|Supported tasks:|Available routes are)", phase="warming_up"),
        rule(r"INFO: +Application startup complete\.", phase="serving"),
        rule(r"Avg prompt throughput: [\d.]+ tokens/s", phase="serving"),
        # A stop (SIGTERM, SIGINT): the API server's handler cancels uvicorn and logs `Shutting down FastAPI HTTP
        # server.` (`entrypoints/launcher.py`, up to 0.22), `[shutdown] API server: shutdown triggered` and the
        # engine core's `[shutdown] EngineCore: trigger received signal=SIGTERM` from 0.24 (`v1/engine/core.py`).
        # An engine death stops uvicorn without either (`Finished server process` after `EngineCore encountered a
        # fatal error.`).
        rule(r"Shutting down FastAPI HTTP server|\[shutdown\] (?:API server: shutdown triggered|EngineCore: trigger "
             r"received signal)", stop=True),
        rule(r"EngineCore failed to start|EngineCore encountered a fatal error", phase="failed", event="fatal"),
        rule(r"Engine core initialization failed|engine core exited unexpectedly", phase="failed", event="fatal"),
        rule(r"Engine core proc(?:ess)? \S+ died unexpectedly|Worker proc \S+ died unexpectedly",
             phase="failed", event="fatal"),
        rule(r"AsyncLLM output_handler failed", phase="failed", event="fatal"),
        rule(r"WorkerProc hit an exception|WorkerProc initialization failed", phase="failed", event="fatal"),
        rule(r"RPC call to \S+ timed out|Timed out waiting for engine core processes", phase="failed", event="fatal"),
        rule(r"No available shared memory broadcast block found", event="stall_warning"),
        rule(r"No available memory for the cache blocks", event="oom"),
        # NIXL's failures, per request (`kv_connector/v1/nixl/base_worker.py:1335-1384`), and P's lease that ran out
        # before D read its blocks (`:3367-3374`).
        rule(r"NIXL transfer failure: (?:handshake_setup_failed|handshake_failed|transfer_failed|transfer_exception|"
             r"transfer_release_failed|notification_failed)", event="kv_transfer_failure"),
        rule(r"Releasing expired KV blocks for request \S+ which were retrieved by", event="kv_transfer_failure"),
    ),
)
