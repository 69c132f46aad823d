"""SGLang (0.4.x to 0.5.x), strings as in sgl-project/sglang 0.5.23: `python/sglang/srt/utils/common.py`
(log format), `srt/managers/scheduler.py`, `srt/model_executor/model_runner.py`, `srt/entrypoints/http_server.py`
(phase lines), `srt/server_args.py` (host 127.0.0.1, port 30000)."""

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

# Prefill/decode disaggregation, strings as in SGLang 0.5.23 (`srt/disaggregation/...`; research/disaggregation.md
# section 1): the lines that say a KV transfer or its handshake failed, on either side. Per request, unlike the
# `warning_once` summaries (`Some requests timed out when bootstrapping...`), so they recur while the stall lasts.
KV_TRANSFER_FAILURES = (
    # D: its heartbeat to P's bootstrap server missed twice (`common/conn.py:2054-2107`).
    r"Lost connection with prefill instance \(bootstrap_addr: ",
    # `prefill.py:1285-1300,1353-1368`, `decode.py:1152-1170,2860-2884`.
    r"(?:Prefill|Decode) transfer failed for request rank=|Prefill bootstrap failed for request rank=",
    r"Decode handshake failed for request rank=",
    # Mooncake's failed-session probe on P (`mooncake/conn.py:2596-2606,2740-2748`).
    r"remote mooncake session \S+ is not alive|\bSession \S+ failed\.",
    r"NIXL transport error for room ",  # `nixl/conn.py:1930`
    r"Could not fetch prefill parallel info from ",  # `decode.py:1206-1213`
    # Each request that timed out (`common/conn.py:2385-2407,2888-2905`).
    r"Request \S+ timed out after [\d.]+s in KVPoll\.(?:Bootstrapping|WaitingForInput)",
    r"Context corruption detected: Request ",  # `decode.py:2656-2664`
)

ENGINE = Engine(
    name="sglang",
    program=re.compile(r"sglang\.launch_server\b|(?:\S*/)?sglang serve\b"),
    default_port=30000,
    role_title=re.compile(r"^sglang::(?P<role>[A-Za-z0-9_]+)"),
    shards=CHECKPOINT_SHARDS,
    # `[time TPn] Prefill batch, ...` / `Decode batch, ...` (srt/managers/scheduler_components/metrics_reporter.py)
    routine_lines=re.compile(rb"\n\[[^\]\n]*\] (?:Prefill|Decode) batch[,.][^\n]*"),
    model_flags=("--model-path", "--model"),
    tp_flags=("--tp-size", "--tensor-parallel-size", "--tp"),
    # `srt/observability/metrics_collector.py`: served at `/metrics` on the API port only with
    # `--enable-metrics`. Schedulers report with labels `model_name`, `tp_rank`, `pp_rank` (and `dp_rank`); with
    # `--enable-metrics-for-all-schedulers` every TP/PP rank repeats its DP group's figures: the largest is taken
    # over those, then DP groups are summed.
    metrics=MetricsSpec(running="sglang:num_running_reqs", waiting="sglang:num_queue_reqs",
                        tokens="sglang:generation_tokens_total", needs_flag=("--enable-metrics",),
                        same_over=("tp_rank", "pp_rank"),
                        # PD queues and completed transfers (`metrics_collector.py:582-604,637-699`).
                        pending=(("bootstrap", "sglang:num_prefill_bootstrap_queue_reqs"),
                                 ("inflight", "sglang:num_prefill_inflight_queue_reqs"),
                                 ("prealloc", "sglang:num_decode_prealloc_queue_reqs"),
                                 ("transfer", "sglang:num_decode_transfer_queue_reqs")),
                        transfers=("sglang:kv_transfer_latency_ms_count",)),
    stats_lines=(
        # `srt/managers/scheduler_components/metrics_reporter.py:963`, every `--decode-log-interval` (40) decode
        # steps of the (attention) TP rank 0 of each DP group: `[time DP0 TP0] Decode batch, #running-req: N,
        # ..., gen throughput (token/s): X, #queue-req: M` (old: `Decode batch. ...`). X is the rate over those
        # steps; lines stop while idle, so one line counts for at most 10 s.
        StatsLine(anchor=b"gen throughput (token/s): ", pattern=re.compile(
            rb"\[[^\]\n]*?(?: DP(?P<rank>\d+)[^\]\n]*)?\] Decode batch[,.] #running-req: (?P<running>\d+),"
            rb"[^\n]*?gen throughput \(token/s\): (?P<throughput>[\d.]+),[^\n]*?#queue-req: (?P<waiting>\d+)"),
            max_interval=10.0),
    ),
    # `--nnodes N --node-rank R --dist-init-addr H:P` (`srt/arg_groups/fields/parallel.py`, alias
    # `--nccl-init-addr`): node R >= 1 runs only schedulers (`sglang::scheduler_TP8`.. with global TP ranks, no
    # detokenizer: `srt/entrypoints/engine.py`), one per local GPU, and a dummy `/health` that answers 200 always.
    # Its logger's `[YYYY-MM-DD HH:MM:SS TPn] ` (`srt/utils/common.py` `configure_logger`); a traceback it logs
    # follows the message's first line unprefixed.
    line_prefix=rb"(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]\n]*\] )?",
    # `--disaggregation-mode null|prefill|decode` (`srt/arg_groups/fields/disagg.py:55-58`).
    disaggregation=Disaggregation(role_flags=("--disaggregation-mode",),
                                  role_values=(("prefill", "prefill"), ("decode", "decode"))),
    # Batch lines of a PD server (`metrics_reporter.py:766-772,1023-1029`): `Prefill batch, ..., #pending-token: 0,
    # #bootstrap-req: 0, #inflight-req: 1, ...` and `Decode batch, ..., pre-allocated usage: 0.18, #prealloc-req: 0,
    # #transfer-req: 22, #retracted-req: 0, ...`; printed only while a batch runs.
    pending_lines=(
        PendingLine(anchor=b"#bootstrap-req: ", pattern=re.compile(
            rb"\[[^\]\n]*?(?: DP(?P<rank>\d+)[^\]\n]*)?\] Prefill batch[^\n]*?#bootstrap-req: (?P<bootstrap>\d+), "
            rb"#inflight-req: (?P<inflight>\d+)"), role="prefill"),
        PendingLine(anchor=b"#prealloc-req: ", pattern=re.compile(
            rb"\[[^\]\n]*?(?: DP(?P<rank>\d+)[^\]\n]*)?\] Decode batch[^\n]*?#prealloc-req: (?P<prealloc>\d+), "
            rb"#transfer-req: (?P<transfer>\d+)"), role="decode"),
    ),
    # The D side's heartbeat to a P that does not answer, every 5 s until it gives up (`common/conn.py:477-485`).
    heartbeats=heartbeats(r"Attempting to reconnect to \S+\.\.\."),
    multinode=MultiNode(
        rendezvous=(Rendezvous(("--dist-init-addr", "--nccl-init-addr")),),
        rank_role=re.compile(r"^scheduler"), nnodes_flags=("--nnodes",), node_rank_flags=("--node-rank",)),
    rules=(
        # The launch banner, once per launch from the main process (`srt/entrypoints/engine.py`
        # `_launch_subprocesses`); a speculative draft model (EAGLE, EAGLE3, MTP/NEXTN, DFLASH) repeats the
        # target's `Init torch distributed begin.`, `Load weight begin.`, shard bar and `Load weight end.` without it.
        rule(r"server_args=ServerArgs\(", phase="launching", launch=True),
        rule(r"Init parallel begin\.|Init torch distributed begin\.", phase="launching"),
        rule(r"Load weight begin\.", phase="loading_weights"),
        rule(r"Load weight end\.|KV Cache is allocated\.|Memory pool end\.", phase="allocating_memory"),
        # `Capture {target|draft} {prefill|decode|verify|extend} CUDA graph begin` (`model_runner_components/
        # cuda_graph_setup.py`, since 2026-06), older `Capture cuda graph begin`, `Capture draft [extend] cuda graph
        # begin` (`speculative/eagle_worker.py`), `Capture piecewise CUDA graph begin`.
        rule(r"Capture (?:[\w-]+ ){0,2}(?:CUDA|cuda) graph begin", phase="capturing_graphs"),
        rule(r"Capturing batches \(", phase="capturing_graphs"),
        rule(r"max_total_num_tokens=\d+|Engine startup timings", phase="warming_up"),
        rule(r"Started server process|Application startup complete\.|Uvicorn running on", phase="warming_up"),
        rule(r"The server is fired up and ready to roll!", phase="serving"),
        # A node with rank >= 1 is ready when its schedulers are: it then starts its dummy health server (`srt/utils/
        # common.py`; before PR #12297 "scheduled on existing loop", whose port stayed refused). Its schedulers log
        # no batch lines (only attention-TP rank 0 does), so it is silent while it serves.
        rule(r"Dummy health check server (?:started in background thread|scheduled on existing loop) at",
             phase="serving"),
        rule(r"\] (?:Prefill|Decode) batch[,.]", phase="serving"),
        # A stop: `SIGTERM received. signum=None frame=None. Draining requests and shutting down...` (its handler in
        # `srt/managers/tokenizer_manager.py`, set at the first request), `Signal SIGTERM received while health check
        # failed. Force exiting.`; a child ended by SIGTERM (`Subprocess scheduler_0 (pid=N) crashed with exit code
        # -15.`, `srt/utils/watchdog.py`) when the whole group got it (systemd's stop). The `SIGQUIT received` that
        # follows is the shutdown's, not a crash.
        rule(r"SIGTERM received(?:\. .*Draining requests| while (?:health check failed|force shutdown))", stop=True),
        # A node with rank >= 1 asked to stop waits for rank 0's shutdown broadcast (`srt/entrypoints/engine.py`).
        rule(r"SIGTERM received on node_rank \d+; waiting for the rank-0 ShutdownReq", stop=True),
        rule(r"crashed with exit code -15\.|scheduler died during initialization \(exit code: -15\)", stop=True),
        rule(r"(?:Scheduler|DetokenizerManager|TokenizerManager) hit an exception", phase="failed", event="fatal"),
        rule(r"Rank \d+ scheduler died during initialization(?! \(exit code: -15\))|Rank \d+ scheduler is dead\.",
             phase="failed", event="fatal"),
        rule(r"Initialization failed\.", phase="failed", event="fatal"),
        rule(r"Capture cuda graph failed", phase="failed", event="fatal"),
        rule(r"crashed with exit code (?!-15\.)-?\d+\. Triggering SIGQUIT", phase="failed", event="fatal"),
        # The parent of a node with rank >= 1 joins its schedulers one by one (`engine.py`): one that exited.
        rule(r"Scheduler or DataParallelController \d+ terminated with (?!-15\b)-?\d+", phase="failed", event="fatal"),
        rule(r"Received sigquit from a child process|SIGQUIT received\.", phase="failed", event="fatal"),
        rule(r"Scheduler watchdog timeout", phase="failed", event="fatal"),
        rule(r"Health check failed\. Server couldn't get a response", event="stall_warning"),
        # PD warmup uses a fake bootstrap host and may fail, and the server still prints `fired up`
        # (`srt/entrypoints/http_server.py:2505-2530,2589-2600`).
        rule(r"Disaggregation warmup failed \(mode=", event="stall_warning"),
        *(rule(line, event="kv_transfer_failure") for line in KV_TRANSFER_FAILURES),
    ),
)
