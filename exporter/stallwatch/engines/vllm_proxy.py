"""vLLM's disaggregated-prefill toy proxy (vllm-project/vllm@030ea52
`tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`, the proxy of `docs/features/nixl_connector_usage.md`):
a FastAPI app that sends each request to a prefiller, then to a decoder.

Watched as a router: its `/healthcheck` is a constant `{"status": "ok", ...}`, so it is never probed, and it has no
metrics page: what it says is who its members are."""

import re

from stallwatch.engines.base import Engine, HostList, Router, rule

ENGINE = Engine(
    name="vllm_proxy",
    program=re.compile(r"(?:\S*/)?toy_proxy_server\.py(?: |$)"),
    default_port=8000,  # `--port` 8000, `--host` localhost
    health_path="",
    router=Router(host_lists=(
        HostList("prefill", ("--prefiller-hosts", "--prefiller-host"), ("--prefiller-ports", "--prefiller-port"),
                 "localhost", 8100),
        HostList("decode", ("--decoder-hosts", "--decoder-host"), ("--decoder-ports", "--decoder-port"),
                 "localhost", 8200),
    )),
    rules=(
        rule(r"INFO: +Started server process", phase="launching", launch=True),
        rule(r"INFO: +Application startup complete\.|Uvicorn running on ", phase="serving"),
    ),
)
