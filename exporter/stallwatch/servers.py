"""Which inference servers are watched: configured ones and those discovered by command line.

A `Server` is the runtime state of one watched server (its main process, derived probe URLs and log
paths, the CPU ledger of its tree). The `Watcher` re-scans processes in the background and hands
changes to whoever listens (probes, log followers).
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import psutil

from stallwatch import netns
from stallwatch.config import Config, Probe, ServerSpec
from stallwatch.engines import ENGINES
from stallwatch.engines.base import Engine
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.tail import LogTail
from stallwatch.proctree import CpuLedger, ProcSample, sample
from stallwatch.text import printable
from stallwatch.workload import LogSource, Workload, locate, log_sources

log = logging.getLogger(__name__)

TREE_CACHE_SECONDS = 0.5  # GPU and process collectors of one scrape share one read of the tree
LIVENESS_SECONDS = 1.0  # how soon a vanished main process turns the phase to stopped or failed


class ProcessKey(NamedTuple):
    """One process for good: a pid alone is reused."""

    pid: int
    create_time: float


@dataclass(frozen=True)
class ProbeTarget:
    """A probe and where it must be made from: `netns_pid` names a process whose network namespace the
    probe has to enter (the server listens on loopback only inside it); None: from the exporter's own."""

    probe: Probe
    netns_pid: int | None = None
    # Derived from the server's command line: made only while its own tree holds a LISTEN socket on the
    # port, so that a `--port` in another user's argv never makes the exporter probe someone else's port.
    derived: bool = False


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
        self.workload = Workload()
        self.listening: tuple[str, ...] | None = None  # addresses with a LISTEN socket on its port; None: unknown
        self.ledger = CpuLedger()
        self._tree: tuple[float, list[ProcSample]] = (float("-inf"), [])
        self.probes: tuple[ProbeTarget, ...] = tuple(ProbeTarget(p) for p in spec.probes or ())
        self.log_sources: tuple[LogSource, ...] = tuple(LogSource(p, p) for p in spec.logs)
        # Kept from the first line read (a tap set later would miss the replayed start), only where it is shown.
        self.tail = LogTail() if config.web.show_evidence else None
        self.interpreter = LogInterpreter(self.engine, tap=self.tail)

    @property
    def port(self) -> int | None:
        return self.engine.listen_address(self.argv)[1] if self.argv else None

    @property
    def model(self) -> str:
        return printable(self.engine.model(self.argv))

    @property
    def tensor_parallel(self) -> str:
        return self.engine.tensor_parallel(self.argv)

    def attach(self, candidate: Candidate, workload: Workload) -> bool:
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
            self.workload = workload
            self.ledger = CpuLedger()
            self._tree = (float("-inf"), [])
            self.listening = self._read_listening()
            if self.spec.probes is None:
                self.probes = self._derived_probes()
            if not self.spec.logs:
                self.log_sources = log_sources(self._config.paths, candidate.pid, workload)
        self.interpreter.process_started(candidate.create_time)
        return True

    def refresh_network(self) -> bool:
        """Re-read the sockets of the server's network namespace (its port opens late): whether its port
        listens, and where to probe it. Reading `/proc/PID/net/tcp` walks the kernel's socket tables (ms on a
        big host), so this runs in the discovery loop, not in a scrape. True when its probes changed."""
        with self._lock:
            self.listening = self._read_listening() if self.is_running() else None
            if self.spec.probes is not None or self.listening is None:
                return False
            probes = self._derived_probes()
            changed, self.probes = probes != self.probes, probes
        return changed

    def _read_listening(self) -> tuple[str, ...] | None:
        port = self.port
        if port is None or self.main_key is None:
            return None
        found = netns.listening(self._config.paths.procfs, self.main_key.pid, port)
        return None if found is None else tuple(found)

    def own_listeners(self) -> list[netns.Socket]:
        """The LISTEN sockets on the server's port that its own process tree holds (socket inodes of its
        network namespace's table matched against the tree's `/proc/PID/fd` links): `[]` when nothing of the
        server listens there, whatever else does."""
        port, main = self.port, self.main
        if port is None or main is None or self.main_key is None or not self.is_running():
            return []
        procfs = self._config.paths.procfs
        sockets = netns.listeners(procfs, self.main_key.pid, port)
        if not sockets:
            return []
        try:
            pids = [main.pid, *(child.pid for child in main.children(recursive=True))]
        except psutil.Error:
            pids = [main.pid]
        held = netns.socket_inodes(procfs, pids)
        return [s for s in sockets if s.inode in held]

    def _derived_probes(self) -> tuple[ProbeTarget, ...]:
        """The health URL at an address of the server's own: in the exporter's network namespace its loopback
        (or the loopback address it binds), in another one the address its socket is bound to or its own
        address (containers.md §5: the pod IP is what kubelet probes dial); a loopback-only socket there can
        only be reached from inside. Of the command line only the port is used, and an IP `--host` as the
        guess of the bind until the server listens: never a name or a path."""
        host, port = self.engine.listen_address(self.argv)
        if port is None or self.main_key is None:
            return ()
        pid, procfs = self.main_key.pid, self._config.paths.procfs
        owned = [s.address for s in self.own_listeners()] if self.listening else []
        binds = list(dict.fromkeys(owned)) or [host if _is_ip(host) else "127.0.0.1"]
        same = netns.same_netns(procfs, pid)
        if same is None:  # /proc/PID/ns/net needs ptrace rights: go by what runs the server
            same = self.workload.runtime in ("host", "systemd")
        own = [] if same else netns.local_addresses(procfs, pid)
        kind, address = netns.probe_target(binds, own)
        netns_pid = pid if kind == "loopback_only" and not same else None
        if kind == "none" or (same and address in ("0.0.0.0", "::")):
            address = "127.0.0.1"
        url_host = f"[{address}]" if ":" in address else address
        probe = Probe(url=f"http://{url_host}:{port}{self.engine.health_path}",
                      timeout=self._config.defaults.probe.timeout, interval=self._config.defaults.probe.interval)
        return (ProbeTarget(probe, netns_pid, derived=True),)

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
        return self.ledger.cap(out)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


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
    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._gone: dict[str, float] = {}  # discovered servers whose process is gone: since when (clock)
        self._lock = threading.Lock()
        self._servers: dict[str, Server] = {}
        self._listeners: list[Callable[[list[Server]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._collisions: set[str] = set()
        for index, spec in enumerate(config.servers):
            name = spec.name or _default_name(spec, index)
            self._servers[name] = Server(name, spec, config)
        self._configured = list(self._servers.values())
        self._configured_names = set(self._servers)

    def servers(self) -> list[Server]:
        with self._lock:
            return list(self._servers.values())

    def on_change(self, listener: Callable[[list[Server]], None]) -> None:
        self._listeners.append(listener)

    def refresh(self, notify: bool = False) -> None:
        """Re-scan processes; tell listeners when a server appeared, relaunched or moved its port (or when
        `notify`)."""
        candidates = scan_processes()
        claimed: set[int] = set()
        changed = False
        for server in self._configured:
            pattern = server.spec.cmdline or server.engine.cmdline
            assert pattern is not None  # config validation guarantees one
            roots = [c for c in _roots(candidates, pattern) if c.pid not in claimed]
            if roots:
                claimed.add(roots[0].pid)
                changed |= self._attach(server, roots[0])
        if self.config.discovery.enabled:
            for engine in ENGINES.values():
                if engine.cmdline is None:
                    continue
                for root in _roots(candidates, engine.cmdline):
                    if root.pid not in claimed:
                        claimed.add(root.pid)
                        changed |= self._discovered(engine, root)
        for server in self.servers():
            changed |= server.refresh_network()
        changed |= self._forget_gone()
        if changed or notify:
            servers = self.servers()
            for listener in self._listeners:
                listener(servers)

    def _forget_gone(self) -> bool:
        """Drop discovered servers whose process has been gone for `discovery.forget_after`, so that short-lived
        processes with new ports do not add threads and series for good; the listeners, told of the change, drop
        their probes and log followers. True when one was dropped. Configured servers stay."""
        now, grace = self._clock(), self.config.discovery.forget_after
        dropped = False
        with self._lock:
            for name, server in list(self._servers.items()):
                if name in self._configured_names or server.is_running():
                    self._gone.pop(name, None)
                    continue
                since = self._gone.setdefault(name, now)
                if now - since >= grace:
                    del self._servers[name], self._gone[name]
                    dropped = True
                    log.info("forgot server %s: its process has been gone for %.0fs", name, now - since)
        return dropped

    def _attach(self, server: Server, candidate: Candidate) -> bool:
        if server.main_key == ProcessKey(candidate.pid, candidate.create_time):
            return False
        return server.attach(candidate, locate(self.config.paths, candidate.pid))

    def _discovered(self, engine: Engine, root: Candidate) -> bool:
        key = ProcessKey(root.pid, root.create_time)
        with self._lock:
            following = next((s for s in self._servers.values() if s.main_key == key), None)
        if following is not None:
            return False
        workload = locate(self.config.paths, root.pid)
        with self._lock:
            name = self._name(engine, root, workload)
            server = self._servers.get(name)
            if server is None:
                spec = ServerSpec(engine=engine.name, stall=self.config.defaults.stall)
                server = self._servers[name] = Server(name, spec, self.config)
                log.info("discovered %s server %s (pid %d, %s)", engine.name, name, root.pid, workload.runtime)
        return server.attach(root, workload)

    def _name(self, engine: Engine, root: Candidate, workload: Workload) -> str:
        """A name unique on the node and stable across restarts of the same workload: a server by that name
        whose process is gone is the same workload restarted; one whose process lives is another server."""
        name = printable(workload.name or f"{engine.name}-{engine.listen_address(root.argv)[1]}")
        if self._taken(name) and workload.pod:
            name = f"{name}/{workload.container}"  # a second server in one pod
        base, suffix = name, 1
        while self._taken(name):
            suffix += 1
            name = f"{base}-{suffix}"
        if suffix > 1 and base not in self._collisions:
            self._collisions.add(base)
            log.warning("two servers would be named %s; the later one (pid %d) is %s", base, root.pid, name)
        return name

    def _taken(self, name: str) -> bool:
        server = self._servers.get(name)
        return server is not None and server.is_running()

    def check_liveness(self) -> None:
        """A main process that is gone ends its phase now, not at the next scrape or discovery pass."""
        for server in self.servers():
            if server.main is not None and not server.is_running():
                server.interpreter.process_gone()

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
