"""Aphrodite Engine, a fork of vLLM V1 (vLLM inside: the label value `aphrodite-vllm`), strings as in
aphrodite-engine/aphrodite-engine at b42eeec2 (2026-04-28): `pyproject.toml` (the `aphrodite` script),
`aphrodite/entrypoints/cli/run.py` and `serve.py` (`aphrodite run|serve MODEL`), `entrypoints/openai/cli_args.py`
(port 2242, host: every address), `utils/system_utils.py` `set_process_title` and `envs.py`
(`APHRODITE::EngineCore`, `APHRODITE::Worker_TP1`, the prefix `APHRODITE_PROCESS_NAME_PREFIX`), `logger.py` and
`logging_utils/formatter.py` (its log format), `v1/metrics/loggers.py` (the `aphrodite:*` families and vLLM's stats
line), `entrypoints/api_server.py`, `entrypoints/utils.py`, `entrypoints/launcher.py` and `entrypoints/openai/
api_server.py` (its own banner, ready and stop lines).

Everything else is vLLM's engine data (`engines/vllm.py`): the engine core's and workers' lines are vLLM's, by
message. Not covered: Aphrodite over several nodes (vLLM's `--headless` reading is not carried over), a process
title prefix other than `APHRODITE`."""

import re
from dataclasses import replace

from stallwatch.engines.base import MetricsSpec, rule
from stallwatch.engines.vllm import ENGINE as VLLM_ENGINE

ENGINE = replace(
    VLLM_ENGINE,
    name="aphrodite-vllm",
    # Not `aphrodite run-batch` (`entrypoints/cli/run_batch.py`), which serves nothing.
    program=re.compile(r"(?:\S*/)?aphrodite (?:run|serve)(?:\s|$)|aphrodite\.entrypoints\.openai\.api_server\b"),
    default_port=2242,
    model_commands=("run", "serve"),
    role_title=re.compile(r"^APHRODITE::(?P<role>[A-Za-z0-9_]+)"),
    # `v1/metrics/loggers.py:479-501,659`: vLLM's families renamed, always served at `/metrics` on the API port.
    metrics=MetricsSpec(running="aphrodite:num_requests_running", waiting="aphrodite:num_requests_waiting",
                        tokens="aphrodite:generation_tokens_total"),
    multinode=None,
    # `logger.py` `_FORMAT_INFO`, the formatter's default (`logging_utils/formatter.py`: `[file:line]` only when
    # verbose, `WARNING` written `WARN`): `INFO 11-20 09:00:01 ` or `INFO 11-20 09:00:01 [api_server     :1090] `,
    # after a child's `(EngineCore pid=7) ` as vLLM writes it.
    line_prefix=(rb"(?:\(\S+ pid=\d+\) )?(?:(?:DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d "
                 rb"(?:\[[^\]\n]*\] )?)?"),
    # Its own lines first (vLLM's banner and ready lines name vLLM, or sit after a `] ` the default format has not).
    rules=(
        # `entrypoints/api_server.py:125`, `entrypoints/utils.py:219,267` (the banner without its logo).
        rule(r"\d\d:\d\d:\d\d (?:\[[^\]\n]*\] )?(?:Aphrodite (?:API )?server version |non-default args: )",
             phase="launching", launch=True),
        # `entrypoints/openai/api_server.py:583,628`, `entrypoints/launcher.py:120`.
        rule(r"Starting Aphrodite server on |\d\d:\d\d:\d\d (?:\[[^\]\n]*\] )?Available routes are:",
             phase="warming_up"),
        *VLLM_ENGINE.rules,
    ),
)
