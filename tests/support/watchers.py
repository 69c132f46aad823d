"""Watchers for the tests: over configured servers only, with discovery off and a command-line match that no process
has, so that what else runs on the machine (another SGLang) never joins the test; or discovering only the candidates
a test hands it, on the test's clock."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from stallwatch.config import Config, Discovery, Paths, ServerSpec
from stallwatch.discovery.processes import Candidate
from stallwatch.discovery.watcher import Watcher
from support.clock import Clock

NO_PROCESS = re.compile(r"no-such-process-matches-this-\d{40}")
SGLANG = ("python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "30000")


def log_watcher(logs: Mapping[str, Sequence[str | Path]], engine: str = "sglang") -> Watcher:
    """One configured server per name, following the given log files."""
    specs = tuple(ServerSpec(engine=engine, name=name, cmdline=NO_PROCESS, logs=tuple(str(p) for p in paths))
                  for name, paths in logs.items())
    return Watcher(Config(servers=specs, discovery=Discovery(enabled=False)))


def candidate(pid: int, argv: tuple[str, ...] = SGLANG) -> Candidate:
    """Process `pid` (alive: its start time is read) as discovery would find it with `argv`."""
    return Candidate(pid, 1, psutil.Process(pid).create_time(), argv, " ".join(argv))


def watcher(tmp_path: Path, found: list[Candidate], clock: Clock | None = None, **config: object) -> Watcher:
    """A discovering watcher whose scans find `found` and nothing else, with procfs under `tmp_path`."""
    base = Config(discovery=Discovery(enabled=True, forget_after=60.0), paths=Paths(procfs=str(tmp_path)))
    return Watcher(dataclasses.replace(base, **config), clock=clock or Clock(), scan=lambda: list(found))
