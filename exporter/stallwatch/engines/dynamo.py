"""NVIDIA Dynamo's workers, `python -m dynamo.vllm|dynamo.sglang|dynamo.trtllm`: each runs its engine in its own
process (vLLM's AsyncLLM, SGLang's `sgl.Engine`, TensorRT-LLM's LLM), so the engine's children, titles and lines
are the engine's; the label value says which is inside (`dynamo-vllm`, `dynamo-sglang`, `dynamo-trtllm`). Strings
as in ai-dynamo/dynamo: `lib/bindings/python/src/dynamo/runtime/logging.py` at 00810a7b (the engines' loggers
sent through Dynamo's Rust logger: `2026-07-08T22:28:35.504473Z  INFO module.function: message`),
`components/src/dynamo/common/utils/graceful_shutdown.py` at 00a36384 (the signal handlers, the stop),
`components/src/dynamo/vllm/engine_monitor.py` at 37361077 (the vLLM worker's monitor and its death), and a
published SGLang worker's log of 2026-07-08 (`Registered base model '...' MDC`, `Model registration succeeded;
processing queued requests`, as `components/src/dynamo/sglang/register.py` logs it).

A worker serves no HTTP port of its own: its `/health`, `/live` and `/metrics` are on `DYN_SYSTEM_PORT`, off by
default (docs.nvidia.com/dynamo, "Health checks"); without it nothing is probed or fetched, the server is named after
its model (`dynamo-vllm-Qwen3-0.6B`) and its phase comes from its log alone, `serving` once its model is registered
with the runtime. The frontend (`python -m dynamo.frontend`, which holds no model) is not watched.

Not covered: judging a worker's progress at the frontend (`dynamo_frontend_output_tokens_total`, keyed by
`DYN_NAMESPACE`); an SGLang worker's DP groups told apart in its batch lines (Dynamo writes them without SGLang's
`[time DPn TPn]` prefix); the SGLang and TensorRT-LLM workers' `/metrics` (what their system port re-exports is
not pinned); the TensorRT-LLM worker's figures; a worker over several nodes.

A worker's prefill/decode role: `--disaggregation-mode prefill|decode|agg|encode` (`dynamo/vllm/backend_args.py:
106-117`, `dynamo/common/constants.py:16-22`, `dynamo/trtllm/backend_args.py:225`), older vLLM workers'
`--is-prefill-worker`/`--is-decode-worker`; its group is its Dynamo graph or namespace (`discovery/pd.py`)."""

import re
from dataclasses import replace

from stallwatch.engines.base import Disaggregation, Engine, Rule, StatsLine, rule
from stallwatch.engines.sglang import ENGINE as SGLANG_ENGINE
from stallwatch.engines.trtllm import ENGINE as TRTLLM_ENGINE
from stallwatch.engines.vllm import ENGINE as VLLM_ENGINE

ROLE = Disaggregation(role_flags=("--disaggregation-mode",), role_values=(("prefill", "prefill"), ("decode", "decode")),
                      prefill_flags=("--is-prefill-worker",), decode_flags=("--is-decode-worker",))

# Every worker's own lines, ahead of its engine's.
WORKER_RULES: tuple[Rule, ...] = (
    # `install_signal_handlers`, before the engine is built (`vllm/main.py` `worker`).
    rule(r"Signal handlers set up for graceful shutdown", phase="launching", launch=True),
    # The model registered with the runtime: requests are routed to it from now on.
    rule(r"Registered base model '[^'\n]*' MDC|Model registration succeeded; processing queued requests",
         phase="serving"),
    # `graceful_shutdown_with_discovery` on SIGTERM or SIGINT.
    rule(r"Received shutdown signal; unregistering endpoints from discovery", stop=True),
)


def worker(inner: Engine, module: str, rules: tuple[Rule, ...] = (), **changes: object) -> Engine:
    """The Dynamo worker that runs `inner` in its own process: the engine's data, with the worker's program, port,
    log prefix and lines."""
    return replace(
        inner,
        name=f"dynamo-{inner.name}",
        program=re.compile(rf"dynamo\.{module}(?:\s|$)"),
        default_port=None,
        default_host="0.0.0.0",
        port_flags=(),
        host_flags=(),
        port_env="DYN_SYSTEM_PORT",
        model_commands=(),
        multinode=None,
        disaggregation=ROLE,
        # The Rust logger's `2026-07-08T22:28:35.504473Z  INFO register.register_model_with_readiness_gate: `.
        # After a child's `(EngineCore_DP0 pid=7) ` as vLLM writes it.
        line_prefix=rb"(?:\(\S+ pid=\d+\) )?(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z +[A-Z]+ +\S+: )?",
        # The worker's own banner starts a launch; the engine's (imported, or built, in the same process) does not.
        rules=WORKER_RULES + rules + tuple(replace(r, launch=False, second_banner=False) for r in inner.rules),
        **changes,
    )


VLLM = worker(VLLM_ENGINE, "vllm", rules=(
    # `VllmEngineMonitor`: set up once the engine is built, before the model is registered; on `EngineDeadError` or a
    # health check that times out it logs these and exits 1.
    rule(r"VllmEngineMonitor initialized and health check task started", phase="warming_up"),
    rule(r"vLLM AsyncLLM health check failed: ", phase="failed", event="fatal"),
), model_flags=("--model",))
SGLANG = worker(SGLANG_ENGINE, "sglang", model_flags=("--model-path", "--model"), metrics=None, stats_lines=(
    # SGLang's decode stats line (`scheduler_components/metrics_reporter.py`) as Dynamo's logger writes it, without
    # SGLang's `[time DPn TPn]` (the published worker log's `INFO scheduler_metrics_mixin.report_prefill_stats: Prefill
    # batch, ...`): one DP group's figures only.
    StatsLine(anchor=b"gen throughput (token/s): ", pattern=re.compile(
        rb"Decode batch[,.] #running-req: (?P<running>\d+),[^\n]*?gen throughput \(token/s\): (?P<throughput>[\d.]+),"
        rb"[^\n]*?#queue-req: (?P<waiting>\d+)"), max_interval=10.0),
))
TRTLLM = worker(TRTLLM_ENGINE, "trtllm", model_flags=("--model-path", "--model"),
                tp_flags=("--tensor-parallel-size",), metrics=None)
ENGINES = (VLLM, SGLANG, TRTLLM)
