"""Per-engine knowledge as data, one module per engine, each defining an `Engine` (`engines/base.py`); nothing
outside this package branches on engine names."""

from __future__ import annotations

from stallwatch.engines import (
    aphrodite,
    dynamo,
    generic,
    llamacpp,
    lmdeploy,
    ollama,
    sglang,
    sglang_router,
    tgi,
    triton,
    trtllm,
    vllm,
    vllm_proxy,
    xinference,
)
from stallwatch.engines.base import Engine

ENGINES: dict[str, Engine] = {e.name: e for e in (sglang.ENGINE, vllm.ENGINE, tgi.ENGINE, llamacpp.ENGINE,
                                                  ollama.ENGINE, trtllm.ENGINE, triton.ENGINE, lmdeploy.ENGINE,
                                                  aphrodite.ENGINE, *dynamo.ENGINES, xinference.ENGINE,
                                                  sglang_router.ENGINE, vllm_proxy.ENGINE, generic.ENGINE)}
