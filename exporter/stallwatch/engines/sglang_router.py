"""SGLang's PD router (sglang-router 0.3.2: `sglang_router/router_args.py`, `launch_router.py`; console scripts
`sglang-router`, `smg`, `amg`; the Rust router's metrics from sgl-project/sglang@584506b `sgl-router/src/metrics.rs`),
its `--mini-lb` and the older `sglang.srt.disaggregation.mini_lb`. Strings as in research/disaggregation.md section 2.

A router is watched as a server of its own kind: it holds no GPU and generates nothing itself. Its `/health` is no
health (the mini_lb's is a constant 200, `mini_lb.py:276-279`), so it is never probed; its health is its own view of
its workers, `sgl_router_worker_health` on its metrics page."""

import re

from stallwatch.engines.base import Engine, Router, rule

ENGINE = Engine(
    name="sglang_router",
    # `launch_router` retitles the process `sglang::router` (`launch_router.py:32`, setproctitle): after that its
    # command line is the title alone, and its workers are read from its metrics page (`signals.router_page`).
    program=re.compile(r"sglang_router\.launch_router\b|sglang_router\.mini_lb\b|sglang\.srt\.disaggregation\.mini_lb\b"
                       r"|(?:\S*/)?(?:sglang-router|smg|amg)(?: |$)|sglang::router\b"),
    default_port=30000,
    default_host="0.0.0.0",
    health_path="",
    router=Router(
        # `--prefill URL [BOOTSTRAP_PORT]` and `--decode URL`, each repeated (`router_args.py:350-364`).
        member_flags=(("--prefill", "prefill"), ("--decode", "decode")),
        # `--prometheus-port` 29000 on 0.0.0.0 (`router_args.py:432-443`); the mini_lb serves no metrics.
        metrics_port_flags=("--prometheus-port",), metrics_default_port=29000, no_metrics_flags=("--mini-lb",),
        # `sgl_router_worker_health{worker}` 1/0 (`worker_url` in the newer gateway), `sgl_router_running_requests
        # {worker}`.
        worker_health="sgl_router_worker_health", worker_labels=("worker", "worker_url"),
        running="sgl_router_running_requests"),
    rules=(
        # `sglang_router_rs::server: src/server.rs:261: Starting router on 0.0.0.0:30000 | mode: PrefillDecode {...`
        # (Mooncake #851), its one line at start: it serves from then on (its workers' health is its own view);
        # the mini_lb is a uvicorn app.
        rule(r"Starting router on \S+ \| mode: |Uvicorn running on ", phase="serving"),
    ),
)
