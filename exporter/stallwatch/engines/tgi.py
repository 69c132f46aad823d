"""Hugging Face text-generation-inference, strings as in huggingface/text-generation-inference (db931fcf):
`launcher/src/main.rs` (launcher lines, hostname 0.0.0.0, port 3000), `router/src/server.rs`."""

import re

from stallwatch.engines.base import Engine, MetricsSpec, heartbeats, rule

ENGINE = Engine(
    name="tgi",
    program=re.compile(r"(?:\S*/)?text-generation-launcher\b"),
    default_port=3000,
    default_host="0.0.0.0",
    role_title=re.compile(r"(?:^|/)text-generation-(?P<role>server|router)\b"),
    host_flags=("--hostname",),
    model_flags=("--model-id",),
    tp_flags=("--num-shard",),
    # The router's `/metrics` on the API port (huggingface/text-generation-inference `router/src/server.rs:2240-2244`):
    # `tgi_batch_current_size` and `tgi_queue_size` gauges, `tgi_request_generated_tokens` a histogram recorded as
    # each request ends (its `_sum` is the generated-tokens counter: it moves when requests finish, not per token).
    metrics=MetricsSpec(running="tgi_batch_current_size", waiting="tgi_queue_size",
                        tokens="tgi_request_generated_tokens_sum"),
    # The launcher's wait loop prints this every 10 s for as long as a shard is not ready (`launcher/src/main.rs:1244`).
    heartbeats=heartbeats(r"Waiting for shard to be ready\.\.\."),
    rules=(
        rule(r"text_generation_launcher: Args \{", phase="launching", launch=True),
        rule(r"Starting check and download process", phase="launching"),
        rule(r"Starting shard|Waiting for shard to be ready", phase="loading_weights"),
        rule(r"Shard ready in|Starting Webserver|Warming up model|Setting max batch total tokens",
             phase="warming_up"),
        rule(r"Cuda Graphs are enabled for sizes", phase="capturing_graphs"),
        rule(r": Connected\r?$", phase="serving"),
        rule(r"Shard \d+ crashed|Webserver Crashed|Shard \d+ failed to start", phase="failed", event="fatal"),
        rule(r"Shard process was signaled to shutdown", phase="failed", event="fatal"),
        # One request's error: the shard logs it with a traceback and goes on (the client gets 424); a shard that
        # dies of it says `Shard N crashed` (`server/text_generation_server/interceptor.py`).
        rule(r"Method \S+ encountered an error", event="fatal", serving=False),
        # A stop: the launcher's `terminate()` (`launcher/src/main.rs`) logs `Terminating webserver` after SIGTERM or
        # SIGINT; after a crash too, but then the launch has failed already.
        rule(r"Terminating webserver|signal received, starting graceful shutdown", stop=True),
    ),
)
