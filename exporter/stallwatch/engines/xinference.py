"""Xinference's model processes, strings as in xorbitsai/inference at 7ecec16b (2026-08-23): each launched model runs
in an actor process of its worker (`xinference-local`, `xinference-worker`) that titles itself `Model:
{replica_model_uid}` as it starts loading (`xinference/core/model.py:478`; the uid `{model_uid}-{rep_id}`,
`{model_uid}-{replica}-{rep_id}` before) and hosts its engine in-process: vLLM, SGLang, llama.cpp or transformers,
chosen per model at launch and named nowhere on the process, so the label value is `xinference` whichever is inside.
Its vLLM or SGLang children keep their engine's titles (`VLLM::EngineCore`, `sglang::scheduler_TP0`).

The process has no HTTP port (the API is the supervisor's, on 9997): nothing is probed or fetched, the server is
named after its model uid (`xinference-qwen2.5-instruct-0`), and its log is its worker's (the worker's stdout and
stderr, shared by every model it hosts). The engine's own lines move the phase by their message (the model is
loaded through `_load_with_redirect`); `ModelActor({uid}) loaded` (`core/model.py:500`) is serving.

A model process that ends without a failure line was terminated by its worker (`exit_is_stop`): `stopped` on
request, no InferenceServerDown; one killed outright (the OOM killer) reads the same.

Not covered: which engine is inside, the supervisor's and workers' own health (`/status`) and metrics
(`xinference:*`, no running/waiting pair), one model's lines told apart from another's in a shared log."""

import re

from stallwatch.engines.base import CHECKPOINT_BAR, Engine, rule
from stallwatch.engines.sglang import ENGINE as SGLANG_ENGINE
from stallwatch.engines.vllm import ENGINE as VLLM_ENGINE

ENGINE = Engine(
    name="xinference",
    # The title replaces the whole command line (setproctitle): `Model: qwen2.5-instruct-0` and the NULs it pads the
    # old one's room with, which read as empty arguments (psutil), or split at its space.
    program=re.compile(r"Model: \S+ *$"),
    default_port=None,
    title_model=re.compile(r"Model: (?P<model>\S+) *$"),
    # The worker ends a model's process when the model is terminated (`core/worker.py` `terminate_model` removes its
    # sub pool), logging nothing in the model's name: an unload, not an outage.
    exit_is_stop=True,
    role_title=re.compile(r"^(?:VLLM|sglang)::(?P<role>[A-Za-z0-9_]+)"),
    # The model's weights bar, whichever engine loads it: vLLM's and SGLang's (`CHECKPOINT_BAR`), and transformers'
    # in tqdm's default format (`modeling_utils.py`: `Loading checkpoint shards: 100%|█████| 2/2 [00:10<00:00,
    # 5.11s/it]`).
    shards=re.compile(rb"(?:" + CHECKPOINT_BAR + rb"|Loading checkpoint shards: *\d+%\|[^|\n\r]*\|) *(\d+)/(\d+)"),
    rules=(
        rule(r"ModelActor\([^)\n]+\) loaded", phase="serving"),
        # `core/model.py:562-565`: the model actor out of memory, then `os._exit(1)`.
        rule(r"Model actor is out of memory, model id: ", phase="failed", event="oom"),
        *(r for r in VLLM_ENGINE.rules + SGLANG_ENGINE.rules if not r.launch),
    ),
)
