"""A `Watcher` over configured servers only, with discovery off and a command-line match that no process has, so
that what else runs on the machine (another SGLang) never joins the test."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from stallwatch.config import Config, Discovery, ServerSpec
from stallwatch.discovery.watcher import Watcher

NO_PROCESS = re.compile(r"no-such-process-matches-this-\d{40}")


def log_watcher(logs: Mapping[str, Sequence[str | Path]], engine: str = "sglang") -> Watcher:
    """One configured server per name, following the given log files."""
    specs = tuple(ServerSpec(engine=engine, name=name, cmdline=NO_PROCESS, logs=tuple(str(p) for p in paths))
                  for name, paths in logs.items())
    return Watcher(Config(servers=specs, discovery=Discovery(enabled=False)))
