"""Which inference servers are watched: configured ones and those discovered by command line.

A `Server` is the runtime state of one watched server (its main process, derived probe URLs and log
paths, the CPU ledger of its tree). The `Watcher` re-scans processes in the background and hands
changes to whoever listens (probes, log followers).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import psutil

from stallwatch.config import Config, Probe, ServerSpec
from stallwatch.engines import ENGINES, Engine
from stallwatch.phase import PhaseTracker
from stallwatch.proctree import CpuLedger, ProcSample, sample

log = logging.getLogger(__name__)

TREE_CACHE_SECONDS = 0.5  # GPU and process collectors of one scrape share one read of the tree
LIVENESS_SECONDS = 1.0  # how soon a vanished main process turns the phase to stopped or failed


class ProcessKey(NamedTuple):
    """One process for good: a pid alone is reused."""

    pid: int
    create_time: float


@dataclass(frozen=True)
class Candidate:
    pid: int
    ppid: int
    create_time: float
    argv: tuple[str, ...]
    cmdline: str  # argv joined by spaces, what config and engine matchers see


class Server:
    def __init__(self, name: str, spec: ServerSpec, config: Config) -> None:
        self.name = name
        self.spec = spec
        self.engine: Engine = ENGINES[spec.engine].with_rules(spec.rules)
        self._config = config
        self._lock = threading.Lock()
        self.main: psutil.Process | None = None
        self.main_key: ProcessKey | None = None
        self.argv: tuple[str, ...] = ()
        self.ledger = CpuLedger()
        self._tree: tuple[float, list[ProcSample]] = (float("-inf"), [])
        self.probes: tuple[Probe, ...] = spec.probes or ()
        self.log_paths: tuple[str, ...] = spec.logs
        self.tracker = PhaseTracker(self.engine)

    def attach(self, candidate: Candidate) -> bool:
        """Follow `candidate` as the main process; True when it is a new launch."""
        key = ProcessKey(candidate.pid, candidate.create_time)
        with self._lock:
            if key == self.main_key and self.main is not None:
                return False
            try:
                self.main = psutil.Process(candidate.pid)
            except psutil.Error:
                return False
            self.main_key = key
            self.argv = candidate.argv
            self.ledger = CpuLedger()
            self._tree = (float("-inf"), [])
            if self.spec.probes is None:
                self.probes = self._derived_probes()
            if not self.spec.logs:
                self.log_paths = _stdio_files(candidate.pid)
        self.tracker.process_started(candidate.create_time)
        return True

    def _derived_probes(self) -> tuple[Probe, ...]:
        host, port = self.engine.listen_address(self.argv)
        if port is None:
            return ()
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        if ":" in host:
            host = f"[{host}]"
        url = f"http://{host}:{port}{self.engine.health_path}"
        return (Probe(url=url, timeout=self._config.defaults.probe.timeout,
                      interval=self._config.defaults.probe.interval),)

    def is_running(self) -> bool:
        main = self.main
        if main is None:
            return False
        try:
            return main.is_running() and main.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def tree(self) -> list[ProcSample]:
        """Main process and all descendants, re-listed at most every TREE_CACHE_SECONDS."""
        with self._lock:
            now = time.monotonic()
            taken, samples = self._tree
            if now - taken < TREE_CACHE_SECONDS:
                return samples
            samples = self._read_tree()
            self._tree = (now, samples)
            return samples

    def _read_tree(self) -> list[ProcSample]:
        main = self.main
        if main is None:
            return []
        try:
            if not main.is_running():
                return []
            children = main.children(recursive=True)
        except psutil.Error:
            return []
        title = self.engine.role_title
        out = [s for s in [sample(main, "main", title)] if s is not None]
        out += [s for s in (sample(child, None, title) for child in children) if s is not None]
        return out


def _stdio_files(pid: int) -> tuple[str, ...]:
    """Regular files that the process's stdout and stderr point to."""
    paths: list[str] = []
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if stat.S_ISREG(os.stat(target).st_mode) and target not in paths:
                paths.append(target)
        except OSError:
            continue
    return tuple(paths)


def scan_processes() -> list[Candidate]:
    out = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"], ad_value=None):
        info = proc.info
        if info.get("cmdline") and info.get("create_time") is not None:
            argv = tuple(info["cmdline"])
            out.append(Candidate(info["pid"], info["ppid"] or 0, info["create_time"], argv, " ".join(argv)))
    out.sort(key=lambda c: c.create_time)
    return out


def _roots(candidates: Iterable[Candidate], pattern: re.Pattern[str]) -> list[Candidate]:
    """Matching processes whose parent does not match too (forked workers keep their parent's argv)."""
    matched = [c for c in candidates if pattern.search(c.cmdline)]
    pids = {c.pid for c in matched}
    return [c for c in matched if c.ppid not in pids]


class Watcher:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._servers: dict[str, Server] = {}
        self._listeners: list[Callable[[list[Server]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        for index, spec in enumerate(config.servers):
            name = spec.name or _default_name(spec, index)
            self._servers[name] = Server(name, spec, config)
        self._configured = list(self._servers.values())

    def servers(self) -> list[Server]:
        with self._lock:
            return list(self._servers.values())

    def on_change(self, listener: Callable[[list[Server]], None]) -> None:
        self._listeners.append(listener)

    def refresh(self, notify: bool = False) -> None:
        """Re-scan processes; tell listeners when a server appeared or relaunched (or when `notify`)."""
        candidates = scan_processes()
        claimed: set[int] = set()
        changed = False
        for server in self._configured:
            pattern = server.spec.cmdline or server.engine.cmdline
            assert pattern is not None  # config validation guarantees one
            roots = [c for c in _roots(candidates, pattern) if c.pid not in claimed]
            if roots:
                claimed.add(roots[0].pid)
                changed |= server.attach(roots[0])
        if self.config.discovery.enabled:
            for engine in ENGINES.values():
                if engine.cmdline is None:
                    continue
                pattern = engine.cmdline
                for root in _roots(candidates, pattern):
                    if root.pid in claimed:
                        continue
                    claimed.add(root.pid)
                    changed |= self._discovered(engine, root)
        if changed or notify:
            servers = self.servers()
            for listener in self._listeners:
                listener(servers)

    def _discovered(self, engine: Engine, root: Candidate) -> bool:
        _, port = engine.listen_address(root.argv)
        name = f"{engine.name}-{port}"
        with self._lock:
            server = self._servers.get(name)
            if server is None:
                spec = ServerSpec(engine=engine.name, stall=self.config.defaults.stall)
                server = self._servers[name] = Server(name, spec, self.config)
                log.info("discovered %s server %s (pid %d)", engine.name, name, root.pid)
        return server.attach(root)

    def check_liveness(self) -> None:
        """A main process that is gone ends its phase now, not at the next scrape or discovery pass."""
        for server in self.servers():
            if server.main is not None and not server.is_running():
                server.tracker.process_gone()

    def start(self) -> None:
        self.refresh(notify=True)
        self._thread = threading.Thread(target=self._loop, name="discovery", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        interval = self.config.discovery.interval
        next_refresh = time.monotonic() + interval
        while not self._stop.wait(min(LIVENESS_SECONDS, interval)):
            try:
                self.check_liveness()
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + interval
                    self.refresh()
            except Exception:
                log.exception("process discovery failed; retrying in %.0fs", interval)


def _default_name(spec: ServerSpec, index: int) -> str:
    engine = ENGINES[spec.engine]
    port: int | None = engine.default_port
    if spec.probes:
        port = urlsplit(spec.probes[0].url).port or port
    return f"{spec.engine}-{port}" if port is not None else f"{spec.engine}-{index}"
