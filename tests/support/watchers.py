"""Watchers and log managers for the tests. A watcher over configured servers only, with discovery off and a
command-line match that no process has, so that what else runs on the machine (another SGLang) never joins the
test; or one discovering only the candidates a test hands it, on the test's clock. A log manager of such a watcher,
not started: a test drives its passes."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import psutil

from stallwatch.config import Config, Discovery, Paths, ServerSpec
from stallwatch.discovery import processes
from stallwatch.discovery.processes import Candidate
from stallwatch.discovery.watcher import Watcher
from stallwatch.logs.follow import FileStats
from stallwatch.signals.logs import LogManager
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


def watcher(tmp_path: Path, found: list[Candidate], clock: Clock | None = None, hold_logs: bool = False,
            owners: Mapping[int, int] | None = None, gpu_pids: Callable[[], Iterable[int]] = tuple,
            **config: object) -> Watcher:
    """A discovering watcher whose scans find `found` and nothing else, with procfs under `tmp_path`; `owners`: the
    uid of each pid (by default, as read), `gpu_pids`: the processes holding GPU memory (none by default)."""
    base = Config(discovery=Discovery(enabled=True, forget_after=60.0), paths=Paths(procfs=str(tmp_path)))
    owner = owners.get if owners is not None else processes.owner
    return Watcher(dataclasses.replace(base, **config), clock=clock or Clock(), scan=lambda: list(found),
                   hold_logs=hold_logs, owner=owner, gpu_pids=gpu_pids)


def watcher_with_logs(tmp_path: Path, count: int) -> tuple[Watcher, list[Path]]:
    """`count` servers `s0`, `s1`... each following a log of its own under `tmp_path` (one line in each)."""
    files = [tmp_path / f"{i}.log" for i in range(count)]
    for f in files:
        f.write_bytes(b"hello\n")
    return log_watcher({f"s{i}": [f] for i, f in enumerate(files)}), files


def manager(*logs: str | Path) -> tuple[LogManager, Watcher, Clock]:
    """A log manager (not started) of one server `s` following `logs`, on a test clock."""
    watcher = log_watcher({"s": logs})
    clock = Clock()
    return LogManager(watcher, poll_interval=1.0, wall=clock), watcher, clock


def stats(m: LogManager, path: str | Path | None = None) -> FileStats:
    """The figures of the one file followed (of `path`)."""
    found = [s for s in m.stats() if path is None or s.path == str(path)]
    assert len(found) == 1, m.stats()
    return found[0]


def phase(watcher: Watcher) -> str:
    """The first server's phase."""
    return watcher.servers()[0].interpreter.snapshot().phase


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)
