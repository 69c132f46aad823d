"""One watched server: its name, config and engine for good, and its current `Launch`.

A `Launch` is what was read of the server's main process when it was found (command line, workload, port,
where to probe it, where its log is) and the CPU ledger of its tree. It is a frozen value replaced whole (at a
relaunch, or when the port opens), so a reader that takes `server.launch` once never sees a new pid with the old
command line. The log interpreter and the log tail live as long as the server does.

Collectors and reports read a server through `look()`: one frozen `Look` of everything they need, taken under the
server's lock. It is the one place where what readers move moves: the CPU ledger and its role cap, and the most
rank processes the launch has had.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

from stallwatch.config import Config, Probe, ServerSpec
from stallwatch.discovery import namespaces, netns
from stallwatch.discovery.deployment import Member, environ_keys, membership, read_environ
from stallwatch.discovery.pd import DYNAMO_KEYS, PdPlace, place
from stallwatch.discovery.processes import (
    Candidate,
    CpuLedger,
    ProcessKey,
    ProcessTable,
    ProcSample,
    sample,
)
from stallwatch.discovery.workload import Workload
from stallwatch.discovery.workload.log_sources import log_sources
from stallwatch.engines import ENGINES
from stallwatch.engines.base import Engine
from stallwatch.logs.follow import HeldLogs
from stallwatch.logs.interpret import LogInterpreter, PhaseSnapshot
from stallwatch.logs.source import LogSource
from stallwatch.logs.tail import LogTail
from stallwatch.stable_names import distinct
from stallwatch.text import printable

TREE_CACHE_SECONDS = 0.5  # GPU and process collectors of one scrape share one read of the tree


@dataclass(frozen=True)
class ProbeTarget:
    """A probe and where it must be made from: `netns_pid` names a process whose network namespace the
    probe has to enter (the server listens on loopback only inside it); None: from the exporter's own."""

    probe: Probe
    netns_pid: int | None = None
    name: str = "health"  # its label, the same across restarts; the URL (a pod IP) is in `probe_info`
    # Derived from the server's command line: made only while its own tree holds a LISTEN socket on the
    # port, so that a `--port` in another user's argv never makes the exporter probe someone else's port.
    derived: bool = False


@dataclass(frozen=True)
class Launch:
    """One launch of a server as it was found; `Launch()` before its process is."""

    key: ProcessKey | None = None
    process: psutil.Process | None = field(default=None, compare=False)
    argv: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # the command line its flags are read from: argv, or argv before a retitle
    workload: Workload = field(default_factory=Workload)
    host: str = ""  # the engine's host, from argv, its environment or the engine's default
    port: int | None = None  # the engine's port, from argv, its environment or the engine's default
    model: str = ""
    tensor_parallel: str = ""
    listening: tuple[str, ...] | None = None  # addresses with a LISTEN socket on its port; None: unknown
    probes: tuple[ProbeTarget, ...] = ()
    log_sources: tuple[LogSource, ...] = ()
    # Each log file's size when the process was found, by `open_path`: what it writes past that is news, however
    # late a follower first opens the file.
    log_sizes: tuple[tuple[str, int], ...] = ()
    held_logs: HeldLogs = field(default_factory=HeldLogs, compare=False)  # its log files, open since it was found
    member: Member | None = None  # its place in a deployment over several nodes; None on one node
    pd: PdPlace | None = None  # its role in a prefill/decode disaggregated group; None when it has none
    uid: int | None = None  # the real uid of its main process
    # The MPI launcher that started the main process as one rank of several (`Engine.rank_env`): its other ranks are
    # part of this server. None when the main process is no rank.
    launcher: psutil.Process | None = field(default=None, compare=False)
    ledger: CpuLedger = field(default_factory=CpuLedger, compare=False)  # per-role CPU of this launch's tree

    @property
    def pid(self) -> int | None:
        return self.key.pid if self.key is not None else None


@dataclass(frozen=True)
class Look:
    """A server as one scrape or one report sees it, at one moment."""

    name: str
    spec: ServerSpec
    engine: Engine
    configured: bool  # from the config file's `servers:`; False: found by discovery
    launch: Launch
    running: bool  # its main process lives (and is no zombie)
    tree: tuple[ProcSample, ...]  # the main process and its descendants, roles capped; () when not running
    cpu: dict[str, tuple[float, float]]  # CPU seconds (user, system) by role over the launch: never going down
    ranks: tuple[int, int] | None  # rank processes living, and the most the launch had; None: engine has no ranks
    log: PhaseSnapshot


class _TreeReading(NamedTuple):
    running: bool
    tree: tuple[ProcSample, ...]
    cpu: dict[str, tuple[float, float]]
    ranks: tuple[int, int] | None


NOT_READ = _TreeReading(False, (), {}, None)


class Server:
    def __init__(self, name: str, spec: ServerSpec, config: Config, table: ProcessTable | None = None,
                 configured: bool = False, hold_logs: bool = False) -> None:
        """`table`: the node's process table, shared by every server of a watcher (one read for all trees);
        `configured`: a server of the config file's `servers:`, which someone said should run; `hold_logs`: hold
        each launch's log files open from the moment it is found until its follower takes them (`HeldLogs`), where
        a follower will."""
        self.name, self.configured, self._hold_logs = name, configured, hold_logs
        self.table = table or ProcessTable(config.paths.procfs, TREE_CACHE_SECONDS)
        self.spec = spec
        self.engine: Engine = ENGINES[spec.engine].with_rules(spec.rules)
        self._worker_engine = ENGINES[spec.engine].as_worker().with_rules(spec.rules)
        self._ranks_started = 0  # the most rank processes this launch's tree has had
        # The MPI rank of each child of the launcher (`_other_ranks`), read once: the environment a process was
        # started with is fixed. A child without one is read again (forked, not yet exec'd with its rank).
        self._sibling_ranks: dict[int, int | None] = {}
        self._config = config
        self._lock = threading.Lock()
        self._tree: tuple[float, _TreeReading] = (float("-inf"), NOT_READ)
        configured = spec.probes or ()
        self.launch = Launch(probes=tuple(ProbeTarget(p, name=name) for p, name in
                                          zip(configured, distinct("health" for _ in configured), strict=True)),
                             log_sources=tuple(LogSource(p, p) for p in spec.logs))
        # Kept from the first line read (a tap set later would miss the replayed start), only where it is shown.
        self.tail = LogTail() if config.web.show_evidence else None
        self.interpreter = LogInterpreter(self.engine, tap=self.tail)

    @property
    def port(self) -> int | None:
        return self.launch.port

    @property
    def procfs(self) -> str:
        return self._config.paths.procfs

    def follows(self, candidate: Candidate) -> bool:
        """Whether `candidate` is the main process as it was attached: the same process with the same command line
        (an `exec` keeps the pid and start time and changes the program, its port and its flags)."""
        launch = self.launch
        return launch.key == ProcessKey(candidate.pid, candidate.create_time) and launch.argv == candidate.argv

    def attach(self, candidate: Candidate, workload: Workload, uid: int | None) -> bool:
        """Follow `candidate` (run by `uid`, its real uid) as the main process, read anew when it exec'd; True when
        anything changed."""
        key = ProcessKey(candidate.pid, candidate.create_time)
        with self._lock:
            if self.follows(candidate) and self.launch.process is not None:
                return False
            try:
                process = psutil.Process(candidate.pid)
            except psutil.Error:
                return False
            argv = flags = candidate.argv
            if key == self.launch.key and sum(1 for arg in argv if arg) == 1 and len(self.launch.flags) > 1:
                # The same process retitled itself (setproctitle: SGLang's router, `sglang::router`, the rest of its
                # argv area NULs): its flags as first read stand.
                flags = self.launch.flags
            environ = read_environ(self._config.paths.procfs, candidate.pid, (*environ_keys(self.engine),
                                                                                  *DYNAMO_KEYS, *self.engine.rank_env))
            member = membership(self.engine, flags, environ, workload, uid)
            host, port = self.engine.listen_address(flags, environ)
            pd = place(self.engine, flags, environ, self.spec.pd_group, self.engine.model(flags), self.spec.pd_role)
            launch = Launch(
                key=key, process=process, argv=argv, flags=flags, workload=workload, host=host, port=port,
                model=printable(self.engine.model(flags)), tensor_parallel=self.engine.tensor_parallel(flags),
                probes=self.launch.probes,
                log_sources=self.launch.log_sources if self.spec.logs else log_sources(
                    self._config.paths, candidate.pid, workload), member=member, pd=pd, uid=uid,
                launcher=_launcher(candidate) if self.engine.mpi_rank(environ) is not None else None)
            launch = dataclasses.replace(launch, log_sizes=_sizes(launch.log_sources),
                                         held_logs=HeldLogs(launch.log_sources if self._hold_logs else ()))
            if key == self.launch.key:  # the same process exec'd: its CPU so far stays counted
                launch = dataclasses.replace(launch, ledger=self.launch.ledger)
            launch = dataclasses.replace(launch, listening=self._read_listening(launch))
            if self.spec.probes is None:
                launch = dataclasses.replace(launch, probes=self._derived_probes(launch))
            self._tree = (float("-inf"), NOT_READ)
            self._ranks_started = 0
            self._sibling_ranks = {}
            self.launch = launch
        self.interpreter.use(self._worker_engine if member is not None and member.worker else self.engine)
        self.interpreter.track_pending(pd.role if pd is not None else "")
        self.interpreter.process_started(candidate.create_time)
        return True

    def relaunched_as(self, workload: Workload, uid: int | None) -> bool:
        """Whether a process of `workload` owned by `uid` can be this (gone) server relaunched: in a container or
        unit the name says which (a pod, a container name, a unit); on the host, the same user."""
        launch = self.launch
        if launch.key is None:
            return True
        if launch.workload.runtime != workload.runtime:
            return False
        return workload.runtime != "host" or launch.uid == uid

    def refresh_network(self) -> bool:
        """Re-read the sockets of the server's network namespace (its port opens late): whether its port
        listens, and where to probe it. Reading `/proc/PID/net/tcp` walks the kernel's socket tables (ms on a
        big host), so this runs in the discovery loop, not in a scrape, and outside the server's lock, which a
        scrape's tree read takes. True when its probes changed."""
        current = self.launch
        listening = self._read_listening(current) if self.is_running() else None
        launch = dataclasses.replace(current, listening=listening)
        changed = False
        if self.spec.probes is None and listening is not None:
            probes = self._derived_probes(launch)
            changed, launch = probes != current.probes, dataclasses.replace(launch, probes=probes)
        with self._lock:
            if self.launch is not current:  # attached anew meanwhile: that launch's own reading stands
                return False
            self.launch = launch
        return changed

    def _read_listening(self, launch: Launch) -> tuple[str, ...] | None:
        """The addresses the server's own tree listens on at its port; None when its namespace's table cannot be
        read. Another process's socket on the port does not count: a server still loading beside an old one that
        holds the port (it binds only once loaded, and then fails) has not opened it. Without the right to read the
        tree's sockets (no CAP_SYS_PTRACE), any socket on the port in its namespace is the best guess."""
        if launch.port is None or launch.key is None:
            return None
        sockets = netns.listeners(self._config.paths.procfs, launch.key.pid, launch.port)
        if sockets is None:
            return None
        held = self._held(launch, sockets)
        return tuple(dict.fromkeys(s.address for s in (sockets if held is None else held)))

    def own_listeners(self, launch: Launch | None = None, port: int | None = None) -> list[netns.Socket]:
        """The LISTEN sockets on the server's port (or `port`: another of its own, a router's metrics port) that its
        own process tree holds (socket inodes of its network namespace's table matched against the tree's
        `/proc/PID/fd` links): `[]` when nothing of the server listens there, whatever else does."""
        launch = launch or self.launch
        key = launch.key
        port = launch.port if port is None else port
        if port is None or key is None:
            return []
        return self._held(launch, netns.listeners(self._config.paths.procfs, key.pid, port) or []) or []

    def _held(self, launch: Launch, sockets: list[netns.Socket]) -> list[netns.Socket] | None:
        """Those of `sockets` that the server's running process tree holds; None when its fds cannot be read."""
        main = launch.process
        if not sockets or main is None or not _running(main):
            return []
        held = netns.socket_inodes(self._config.paths.procfs, [main.pid, *self.table.descendants(main.pid)])
        return None if held is None else [s for s in sockets if s.inode in held]

    def _derived_probes(self, launch: Launch) -> tuple[ProbeTarget, ...]:
        """The health URL at an address of the server's own: in the exporter's network namespace its loopback
        (or the loopback address it binds), in another one the address its socket is bound to or its own
        address (the pod IP is what kubelet's probes dial: k8s.io/api core/v1 `HTTPGetAction.Host`, "defaults to
        the pod IP"); a loopback-only socket there can only be reached from inside. Of the command line (or the
        engine's address variable, `OLLAMA_HOST`) only the port is used, and an IP host as the guess of the bind
        until the server listens: never a name or a path."""
        host, port = launch.host, launch.port
        if port is None or launch.key is None or not self.engine.health_path:
            return ()  # no health URL (a router whose `/health` is a constant): never probed
        pid, procfs = launch.key.pid, self._config.paths.procfs
        binds = list(launch.listening or ()) or [host if _is_ip(host) else "127.0.0.1"]
        same = netns.same_netns(procfs, pid)
        if same is None:  # /proc/PID/ns/net needs ptrace rights: go by what runs the server
            same = launch.workload.runtime in ("host", "systemd")
        own = [] if same else netns.local_addresses(procfs, pid)
        kind, address = netns.choose_address(binds, own)
        if kind == "address" and not same and not namespaces.made_by_root(procfs, pid, "net"):
            # A namespace its own user made holds any address it chose, which in ours may be someone else's:
            # dialled from here, the probe and the page fetch would reach that other host. Only from inside.
            kind = "loopback_only"
        netns_pid = pid if kind == "loopback_only" and not same else None
        if kind == "none" or (same and address in ("0.0.0.0", "::")):
            address = "127.0.0.1"
        url_host = f"[{address}]" if ":" in address else address
        probe = Probe(url=f"http://{url_host}:{port}{self.engine.health_path}",
                      timeout=self._config.defaults.probe.timeout, interval=self._config.defaults.probe.interval)
        return (ProbeTarget(probe, netns_pid, derived=True),)

    def is_running(self) -> bool:
        main = self.launch.process
        return main is not None and _running(main)

    def look(self) -> Look:
        """The server now. What its process tree says (whether it runs, the tree, the CPU by role, the ranks) is read
        at most every TREE_CACHE_SECONDS, and the collectors of one scrape share that reading: the CPU ledger and
        the rank high-water mark move with a new reading, here and nowhere else."""
        with self._lock:
            launch = self.launch
            now = time.monotonic()
            taken, seen = self._tree
            if now - taken >= TREE_CACHE_SECONDS:
                seen = self._read(launch)
                self._tree = (now, seen)
            log = self.interpreter.snapshot()  # its lock is taken inside this one only (never the other way)
        running, tree, cpu, ranks = seen
        return Look(self.name, self.spec, self.engine, self.configured, launch, running, tree, cpu, ranks, log)

    def _read(self, launch: Launch) -> _TreeReading:
        """A new reading of the tree (under the server's lock)."""
        running = launch.process is not None and _running(launch.process)
        tree = self._read_tree(launch) if running else []
        ranks = None
        spec = self.engine.multinode
        if spec is not None and running:
            live = sum(1 for s in tree if s.state != "Z" and spec.rank_role.search(s.role))
            self._ranks_started = max(self._ranks_started, live)
            ranks = live, self._ranks_started
        return _TreeReading(running, tuple(tree), launch.ledger.update(tree), ranks)

    def _read_tree(self, launch: Launch) -> list[ProcSample]:
        main = launch.process
        if main is None:
            return []
        try:
            if not main.is_running():
                return []
        except psutil.Error:
            return []
        title = self.engine.role_title
        out = [s for s in [sample(main, "main", title)] if s is not None]
        below = [(pid, None) for pid in self.table.descendants(main.pid)]
        for pid, role in [*below, *self._other_ranks(launch)]:
            try:
                child = psutil.Process(pid)
            except psutil.Error:
                continue
            found = sample(child, role, title)
            if found is not None:
                out.append(found)
        return launch.ledger.cap(out)

    def _other_ranks(self, launch: Launch) -> list[tuple[int, str | None]]:
        """The other ranks of the MPI job whose rank the main process is, each titled by its rank (`rank1`), with
        everything below them (role from their titles): the launcher's other children that have a rank. Triton's
        ranks above 0 hold their share of the engine's GPU memory and do its work, but are rank 0's siblings, not
        its children. Only while the launcher that started the main process lives: a rank left to init when its
        launcher died has init's children for siblings."""
        launcher = launch.launcher
        if launcher is None or not _running(launcher):
            return []
        siblings = [pid for pid in self.table.children(launcher.pid) if pid != launch.pid]
        known = self._sibling_ranks
        self._sibling_ranks = {pid: known[pid] if known.get(pid) is not None else self.engine.mpi_rank(
            read_environ(self._config.paths.procfs, pid, self.engine.rank_env)) for pid in siblings}
        out: list[tuple[int, str | None]] = []
        for pid, rank in self._sibling_ranks.items():
            if rank is not None:
                out.append((pid, f"rank{rank}"))
                out.extend((below, None) for below in self.table.descendants(pid))
        return out


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _launcher(candidate: Candidate) -> psutil.Process | None:
    """The process that started `candidate`, unless that is init (its parent gone, or no launcher at all)."""
    if candidate.ppid <= 1:
        return None
    try:
        return psutil.Process(candidate.ppid)
    except psutil.Error:
        return None


def _sizes(sources: tuple[LogSource, ...]) -> tuple[tuple[str, int], ...]:
    """The size of each file source now (a stat, which opens nothing); those that cannot be stat'ed are left out."""
    out = []
    for source in sources:
        if source.open_path and source.format != "journal":
            try:
                out.append((source.open_path, os.stat(source.open_path).st_size))
            except (OSError, ValueError):  # not there yet, unreadable, a NUL: its follower's own start then
                continue
    return tuple(out)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
