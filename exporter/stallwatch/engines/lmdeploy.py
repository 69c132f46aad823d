"""LMDeploy's `lmdeploy serve api_server MODEL` (TurboMind and PyTorch engines), strings as in InternLM/lmdeploy at
1263d5cd (2026-08-21): `lmdeploy/cli/serve.py`, `cli/utils.py` (flags: `--server-name` 0.0.0.0, `--server-port`
23333, `--tp`, `--disable-metrics`), `serve/openai/api_server.py` (the server), `serve/core/health.py`,
`serve/core/async_engine.py` and `serve/openai/endpoints/management.py` (`/health`), `metrics/loggers.py` (the stats
line and the `lmdeploy:*` families), `utils.py` (the log format), `pytorch/engine/executor/base.py` and
`pytorch/weight_loader/model_weight_loader.py` (the PyTorch engine's phases), `pytorch/engine/engine.py`,
`engine_loop.py` and `mp_engine/zmq_engine.py` (its failures). Its HTTP server is uvicorn, started with
`uvicorn.run(host, port)` once the engine is built: the port is not bound while it loads (refused).

What it logs depends on `--log-level`, WARNING by default: then none of its logger's INFO lines (the launch's
`input backend=...`, `Building Model.`, ...) but still the weights bar (tqdm, rank 0), the three `HINT:` lines
(`print`), uvicorn's lines (its own `info` level) and the stats line (`print`).

Not covered: `lmdeploy serve proxy` (a router holding no model), the PyTorch engine with `--dp` > 1 (one API server
per DP rank behind a proxy), `lmdeploy serve gradio`, and TurboMind's own phases (its `[TM][INFO]` lines are not
read beyond its fatal ones). The PyTorch engine's process, renamed `ZMQMPEngine` by `prctl` (its `comm`, not its
command line: `mp_engine/zmq_engine.py:107-112`), is the role `ZMQMPEngine`."""

import re

from stallwatch.engines.base import Disaggregation, Engine, MetricsSpec, StatsLine, heartbeats, rule

ENGINE = Engine(
    name="lmdeploy",
    # `lmdeploy serve api_server` (the `lmdeploy = lmdeploy.cli:run` script, or `python -m lmdeploy`), and the
    # server's module run by itself (`python -m lmdeploy.serve.openai.api_server`, its `fire.Fire(serve)`); not
    # `lmdeploy serve proxy` nor `gradio`.
    program=re.compile(r"(?:\S*/)?lmdeploy serve api_server\b|lmdeploy\.serve\.openai\.api_server\b"),
    default_port=23333,
    default_host="0.0.0.0",
    port_flags=("--server-port",),
    host_flags=("--server-name",),
    model_commands=("api_server",),
    model_flags=("--model-path", "--model_path"),
    tp_flags=("--tp",),
    # `--role Hybrid|Prefill|Decode` of a PD disaggregated server (research/disaggregation.md section 8; `Hybrid`, the
    # default, is none).
    disaggregation=Disaggregation(role_flags=("--role",), role_values=(("prefill", "prefill"), ("decode", "decode"))),
    # `/health` (`endpoints/management.py`): 200 `{"status": "healthy", ...}` (or `sleeping`), else 503 with the
    # monitor's `message` (`serve/core/health.py`, `async_engine.py` `_validate_scheduler_progress`): `Backend
    # scheduler_tick has not advanced for 95.3s.` (a stalled scheduler with requests dispatched, since 2026-05-28,
    # PRs #4615, #4645), `Backend has dispatched request handle(s), but schedule metrics report no active or waiting
    # sequences.`, `No successful health probe for 91.2s.`, `PyTorch ZMQ engine process is not alive.`.
    health_message="message",
    # `metrics/loggers.py` PrometheusStatLogger (labels `model_name`, `engine` = the DP rank), mounted at `/metrics`
    # (`api_server.py` `mount_metrics`) unless `--disable-metrics`; its families are updated every 10 s
    # (`_force_log`). FastAPI's 404 when it is off by another way than the flag.
    metrics=MetricsSpec(running="lmdeploy:num_requests_running", waiting="lmdeploy:num_requests_waiting",
                        tokens="lmdeploy:generation_tokens_total", off_flags=("--disable-metrics",),
                        absent_status=(404,)),
    stats_lines=(
        # `metrics/loggers.py:97-127` LoggingStatLogger, every 10 s while metrics are on, skipped when no token was
        # processed since the last: `[2026-11-20 09:14:02 DP0] Avg thr (in/out): 12.3 / 456.7 tokens/s, Server
        # (succeeded/failed/routed/waiting): 10 / 0 / 3 / 0, Engine (running/waiting): 3 / 0, KV cache: 12.5%, `.
        # The throughput is the mean since the previous line.
        StatsLine(anchor=b"Avg thr (in/out): ", pattern=re.compile(
            rb"\[[^\]\n]*? DP(?P<rank>\d+)\] Avg thr \(in/out\): [\d.]+ / (?P<throughput>[\d.]+) tokens/s, "
            rb"[^\n]*?Engine \(running/waiting\): (?P<running>\d+) / (?P<waiting>\d+)"), max_interval=10.0),
    ),
    # The weights bar (tqdm on rank 0, one step per safetensors file): `Loading weights from safetensors:  50%|█████
    # | 4/8 [00:12<00:12,  3.05s/it]`.
    shards=re.compile(rb"Loading weights from safetensors: *\d+%(?:\|[^|\n\r]*\|)? +(\d+)/(\d+)"),
    # Its logger's `2026-11-20 09:14:02,123 - lmdeploy - INFO - base.py:450 - ` (`utils.py` `_FORMAT`; with
    # `LMDEPLOY_LOG_PID=1` a `[pid=N ppid=N] - ` before the file).
    line_prefix=(rb"(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - \S+ - [A-Z]+ - (?:\[pid=\d+ ppid=\d+\] - )?"
                 rb"[\w./-]+:\d+ - )?"),
    # uvicorn's access log (`log_level` info, `UVICORN_LOG_LEVEL`): the polled pages (stallwatch's own probe and
    # fetch among them) say nothing of the engine.
    heartbeats=heartbeats(r'INFO: +\S+ - "GET /(?:health|metrics|v1/models)(?:\?\S*)? HTTP/[\d.]+" \d+'),
    rules=(
        # The API server's first line of its logger (`serve/core/async_engine.py:130`, at `--log-level INFO`).
        rule(r" - input backend=\w+, backend_config=", phase="launching", launch=True),
        # The PyTorch engine (`pytorch/engine/executor/__init__.py:101`, `executor/base.py:450-466`): the executor,
        # the model and its weights, then the configs (the free memory sized for the cache), the graph runner and
        # the KV cache, then the warm-up.
        rule(r" - Build <\w+> executor\.", phase="launching"),
        rule(r" - Building Model\.|Loading weights from safetensors", phase="loading_weights"),
        rule(r" - (?:Updating configs\.|Building GraphRunner and warmup ops|Building (?:Spec )?CacheEngine with "
             r"config)", phase="allocating_memory"),
        rule(r" - Warming up (?:model\.|distribute environment)", phase="warming_up"),
        # Printed three times just before uvicorn starts (`api_server.py:432-436`), the engine built.
        rule(r"^HINT: +Please open ", phase="warming_up"),
        # uvicorn's lifespan once the engine loop and the health monitor started (`create_lifespan_handler`).
        rule(r"INFO: +Application startup complete\.", phase="serving"),
        rule(r"\] Avg thr \(in/out\): ", phase="serving"),
        # A stop: uvicorn's `Shutting down` on SIGTERM or SIGINT (`uvicorn/server.py`), the PyTorch engine's process
        # told to stop (`mp_engine/zmq_engine.py:138,151`). `Finished server process` follows every exit: no stop.
        rule(r"INFO: +Shutting down\r?$|MP process received signal SIG[A-Z]+, stopping server\.|Received "
             r"KeyboardInterrupt, stopping mp process\.", stop=True),
        # The engine dies behind the live API server (`pytorch/engine/engine.py:625` `logger.exception`,
        # `engine_loop.py:639`, `mp_engine/zmq_engine.py:172`, `mp_engine/zmq_rpc.py` `mark_dead`): failed, also once
        # serving, whatever `/health` answers until its monitor notices.
        rule(r" - (?:Engine main loop failed\.|EngineLoop wait_tasks failed\.|RPC Server stopped with exception\.|"
             r"PyTorch ZMQ engine process is not alive\.)", phase="failed", event="fatal"),
        # TurboMind's fatal log level (`src/turbomind/core/logger.cc` `Prefix`: `[TM][FATAL][time]`).
        rule(r"\[TM\]\[FATAL\]", phase="failed", event="fatal"),
    ),
)
