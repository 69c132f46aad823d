"""SGLang (0.4.x to 0.5.x), strings as in sgl-project/sglang 0.5.23: `python/sglang/srt/utils/common.py`
(log format), `srt/managers/scheduler.py`, `srt/model_executor/model_runner.py`, `srt/entrypoints/http_server.py`
(phase lines), `srt/server_args.py` (host 127.0.0.1, port 30000)."""

import re

from stallwatch.engines import SAFETENSORS_SHARDS, Engine, rule

ENGINE = Engine(
    name="sglang",
    cmdline=re.compile(r"sglang\.launch_server|(?:^|/)sglang serve\b"),
    default_port=30000,
    role_title=re.compile(r"^sglang::(?P<role>[A-Za-z0-9_]+)"),
    shards=SAFETENSORS_SHARDS,
    # `[time TPn] Prefill batch, ...` / `Decode batch, ...` (srt/managers/scheduler_components/metrics_reporter.py)
    routine_lines=re.compile(rb"\n\[[^\]\n]*\] (?:Prefill|Decode) batch[,.][^\n]*"),
    model_flags=("--model-path", "--model"),
    tp_flags=("--tp-size", "--tensor-parallel-size", "--tp"),
    rules=(
        rule(r"server_args=ServerArgs\(", phase="launching"),
        rule(r"Init parallel begin\.|Init torch distributed begin\.", phase="launching"),
        rule(r"Load weight begin\.", phase="loading_weights"),
        rule(r"Load weight end\.|KV Cache is allocated\.|Memory pool end\.", phase="allocating_memory"),
        rule(r"Capture (?:target|draft) \w+ CUDA graph begin|Capture cuda graph begin", phase="capturing_graphs"),
        rule(r"Capturing batches \(", phase="capturing_graphs"),
        rule(r"max_total_num_tokens=\d+|Engine startup timings", phase="warming_up"),
        rule(r"Started server process|Application startup complete\.|Uvicorn running on", phase="warming_up"),
        rule(r"The server is fired up and ready to roll!", phase="serving"),
        rule(r"\] (?:Prefill|Decode) batch[,.]", phase="serving"),
        rule(r"Scheduler hit an exception", phase="failed", event="fatal"),
        rule(r"Rank \d+ scheduler died during initialization|Rank \d+ scheduler is dead\.",
             phase="failed", event="fatal"),
        rule(r"Initialization failed\.", phase="failed", event="fatal"),
        rule(r"Capture cuda graph failed", phase="failed", event="fatal"),
        rule(r"crashed with exit code -?\d+\. Triggering SIGQUIT", phase="failed", event="fatal"),
        rule(r"Received sigquit from a child process|SIGQUIT received\.", phase="failed", event="fatal"),
        rule(r"Scheduler watchdog timeout", phase="failed", event="fatal"),
        rule(r"Health check failed\. Server couldn't get a response", event="stall_warning"),
    ),
)
