"""Processes: the node's candidates for servers (`scan`), and a server's process tree with role names, states and
CPU totals that never decrease while it lives."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

from stallwatch.procfs import pid_path, read_bounded

STATES = ("R", "S", "D", "Z", "T", "I")
_STATE_LETTER = {
    psutil.STATUS_RUNNING: "R",
    psutil.STATUS_SLEEPING: "S",
    psutil.STATUS_DISK_SLEEP: "D",
    psutil.STATUS_ZOMBIE: "Z",
    psutil.STATUS_DEAD: "Z",
    psutil.STATUS_STOPPED: "T",
    psutil.STATUS_TRACING_STOP: "T",
    psutil.STATUS_IDLE: "I",
    psutil.STATUS_PARKED: "I",
}
STAT_READ_LIMIT = 4096  # a `stat` line is at most a few hundred bytes; `comm` at most 64
_PID_SUFFIX = re.compile(r"[:_-]\d+$")
# Roles per server: titles are chosen by the server's children, so a child that renames itself in a loop would
# otherwise add series without end. Past the cap, new roles share OTHER_ROLE.
MAX_ROLES = 64
OTHER_ROLE = "other"


class ProcessKey(NamedTuple):
    """One process for good: a pid alone is reused."""

    pid: int
    create_time: float


@dataclass(frozen=True)
class Candidate:
    """A process that might be a server's main process, as `scan` lists it."""

    pid: int
    ppid: int
    create_time: float
    argv: tuple[str, ...]
    cmdline: str  # argv joined by spaces, what a configured `match.cmdline` sees

    @functools.cached_property
    def invocation(self) -> str:
        """What an engine's `program` pattern sees: `invocation(argv)`, worked out once for every engine's match."""
        return invocation(self.argv)


# A Python interpreter's name (`python`, `python3.12`, `pypy3`), and its options: the ones taking the next argument
# (`-W default`) and one naming the module it runs, after option letters that take none (`-um vllm...`).
_INTERPRETER = re.compile(r"(?:python|pypy)(?:\d+(?:\.\d+)*)?[dmw]?")
_OPTION_WITH_VALUE = re.compile(r"-[BbdEhIiOPqRsSuVv]*[WX]$|--check-hash-based-pycs$")
_MODULE_OPTION = re.compile(r"-[BbdEhIiOPqRsSuVv]*m(.*)")


def invocation(argv: tuple[str, ...] | list[str]) -> str:
    """The program a process runs and its arguments, joined by spaces: argv[0], or for a Python interpreter the
    module after `-m` or the script it is given. A debugger, tracer, editor or launcher given a server's path
    (`gdb --args llama-server`, `strace -f vllm serve`, `sh -c '... exec python -m sglang.launch_server'`) runs
    itself, not the server (the server is the process it starts)."""
    if not argv:
        return ""
    if _INTERPRETER.fullmatch(argv[0].rsplit("/", 1)[-1]):
        rest = iter(range(1, len(argv)))
        for i in rest:
            arg = argv[i]
            module = _MODULE_OPTION.fullmatch(arg)
            if module:
                return " ".join((module.group(1), *argv[i + 1:]) if module.group(1) else argv[i + 1:])
            if arg.startswith("-c") or arg == "-":
                break  # inline code or stdin: the interpreter's own
            if _OPTION_WITH_VALUE.match(arg):
                next(rest, None)
            elif not arg.startswith("-"):
                return " ".join(argv[i:])
    return " ".join(argv)


def scan() -> list[Candidate]:
    """Every process with a command line, oldest first (psutil, under `psutil.PROCFS_PATH`)."""
    out = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"], ad_value=None):
        info = proc.info
        if info.get("cmdline") and info.get("create_time") is not None:
            argv = tuple(info["cmdline"])
            out.append(Candidate(info["pid"], info["ppid"] or 0, info["create_time"], argv, " ".join(argv)))
    out.sort(key=lambda c: c.create_time)
    return out


class ProcessTable:
    """The parent of every process, read once for all servers' trees at most every `max_age` seconds: psutil's
    `children(recursive=True)` reads every `/proc/PID/stat` on each call, which made scrapes cost servers x
    processes (docs/research/audit-2026-12-01.md #3)."""

    def __init__(self, procfs: str, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs, self.max_age, self._clock = procfs, max_age, clock
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._children: dict[int, list[int]] = {}

    def children(self, pid: int) -> list[int]:
        """The processes whose parent is `pid`."""
        return list(self._current().get(pid, ()))

    def descendants(self, pid: int) -> list[int]:
        """Every process below `pid`, parents before children."""
        children = self._current()
        out, pending = [], list(children.get(pid, ()))
        while pending:
            child = pending.pop(0)
            out.append(child)
            pending.extend(children.get(child, ()))
        return out

    def _current(self) -> dict[int, list[int]]:
        with self._lock:
            now = self._clock()
            if now - self._read_at >= self.max_age:
                self._children, self._read_at = self._read(), now
            return self._children

    def _read(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = defaultdict(list)
        try:
            entries = [entry.name for entry in os.scandir(self.procfs) if entry.name.isascii() and entry.name.isdigit()]
        except OSError:
            return children
        for name in entries:
            ppid = _ppid(self.procfs, int(name))
            if ppid is not None:
                children[ppid].append(int(name))
        return children


def _ppid(procfs: str, pid: int) -> int | None:
    """The parent pid in a `/proc/PID/stat` (after the `(comm)` a process can fill with spaces and parentheses)."""
    try:
        data = read_bounded(pid_path(procfs, pid, "stat"), STAT_READ_LIMIT)
        fields = data[data.rindex(b")") + 2:].split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def owner(pid: int) -> int | None:
    """The real uid of process `pid`; None when it is gone or cannot be read."""
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return None


@dataclass(frozen=True)
class ProcSample:
    pid: int
    create_time: float
    role: str
    state: str
    cpu_user: float
    cpu_system: float
    rss: int
    threads: int


def cpu_totals(tree: Iterable[ProcSample]) -> dict[ProcessKey, float]:
    """The CPU seconds (user + system) each process of a tree has used so far, by pid and start time."""
    return {ProcessKey(s.pid, s.create_time): s.cpu_user + s.cpu_system for s in tree}


def role_name(cmdline: list[str], comm: str, title: re.Pattern[str] | None) -> str:
    """A stable role from a child's title (`sglang::scheduler_TP3` -> `scheduler_TP3`) or the program it runs
    (`Engine.role_title`), never a pid."""
    if title is not None and cmdline:
        match = title.search(" ".join(cmdline))
        if match and match.lastgroup is not None:
            # `sglang::tokenizer_worker:{pid}` would put a pid in a label.
            return _PID_SUFFIX.sub("", match.group("role")) if match.lastgroup == "role" else match.lastgroup
    return comm or "unknown"


def sample(proc: psutil.Process, role: str | None, title: re.Pattern[str] | None) -> ProcSample | None:
    """One process's figures, or None when it vanished or cannot be read."""
    try:
        with proc.oneshot():
            if role is None:
                try:
                    cmdline = proc.cmdline()
                except (psutil.ZombieProcess, psutil.AccessDenied):
                    cmdline = []
                role = role_name(cmdline, proc.name(), title)
            status = proc.status()
            state = _STATE_LETTER.get(status, "S")
            try:
                times = proc.cpu_times()
                cpu_user, cpu_system = times.user, times.system
                memory = proc.memory_info().rss
                threads = proc.num_threads()
            except (psutil.ZombieProcess, psutil.AccessDenied):
                cpu_user = cpu_system = 0.0
                memory = threads = 0
            return ProcSample(proc.pid, proc.create_time(), role, state, cpu_user, cpu_system, memory, threads)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
        return None


@dataclass
class _Live:
    role: str
    user: float
    system: float
    base_user: float = 0.0  # CPU already credited to an earlier role of the same process
    base_system: float = 0.0


@dataclass
class CpuLedger:
    """Per-role CPU totals of one server's tree that stay monotonic as children come, go or get renamed."""

    credited: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0]))
    live: dict[tuple[int, float], _Live] = field(default_factory=dict)
    roles: set[str] = field(default_factory=set)  # the roles given a series of their own, first come

    def cap(self, samples: list[ProcSample]) -> list[ProcSample]:
        """`samples` with every role past the first MAX_ROLES seen renamed OTHER_ROLE. A role keeps its place
        once given (its CPU counter lives on after its processes exit), so the set only grows to the cap."""
        out = []
        for s in samples:
            if s.role not in self.roles and len(self.roles) < MAX_ROLES:
                self.roles.add(s.role)
            out.append(s if s.role in self.roles else dataclasses.replace(s, role=OTHER_ROLE))
        return out

    def update(self, samples: list[ProcSample]) -> dict[str, tuple[float, float]]:
        current: dict[tuple[int, float], _Live] = {}
        for s in samples:
            key = (s.pid, s.create_time)
            previous = self.live.get(key)
            entry = _Live(s.role, s.cpu_user, s.cpu_system)
            if previous is not None:
                entry.base_user, entry.base_system = previous.base_user, previous.base_system
                if previous.role != s.role:  # setproctitle ran: hand what was used so far to the old role
                    self._credit(previous)
                    entry.base_user, entry.base_system = previous.user, previous.system
            current[key] = entry
        for key, gone in self.live.items():
            if key not in current:
                self._credit(gone)
        self.live = current
        totals: dict[str, tuple[float, float]] = {role: (v[0], v[1]) for role, v in self.credited.items()}
        for entry in current.values():
            user, system = totals.get(entry.role, (0.0, 0.0))
            totals[entry.role] = (
                user + max(0.0, entry.user - entry.base_user),
                system + max(0.0, entry.system - entry.base_system),
            )
        return totals

    def _credit(self, entry: _Live) -> None:
        acc = self.credited[entry.role]
        acc[0] += max(0.0, entry.user - entry.base_user)
        acc[1] += max(0.0, entry.system - entry.base_system)
