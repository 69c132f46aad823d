"""Which inference servers are watched: configured ones and those discovered by command line.

The `Watcher` re-scans processes in the background (`processes.scan`, or the `scan` it is given), names what it
finds, forgets what has long been gone, and hands changes to whoever listens (probes, engine pages, log
followers).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from stallwatch.config import Config, ServerSpec
from stallwatch.discovery import processes
from stallwatch.discovery.deployment import read_environ
from stallwatch.discovery.processes import Candidate, ProcessKey, ProcessTable
from stallwatch.discovery.server import TREE_CACHE_SECONDS, Server
from stallwatch.discovery.workload import Workload, locate
from stallwatch.discovery.workload.cgroup import short_id
from stallwatch.engines import ENGINES
from stallwatch.engines.base import Engine
from stallwatch.loops import run_every
from stallwatch.text import printable

log = logging.getLogger(__name__)

LIVENESS_SECONDS = 1.0  # how soon a vanished main process turns the phase to stopped or failed


def _roots(candidates: Iterable[Candidate], matches: Callable[[Candidate], bool]) -> list[Candidate]:
    """Matching processes whose parent does not match too (forked workers keep their parent's argv)."""
    matched = [c for c in candidates if matches(c)]
    pids = {c.pid for c in matched}
    return [c for c in matched if c.ppid not in pids]


def _inside(candidate: Candidate, watched: set[int], parents: dict[int, int]) -> bool:
    """Whether one of the process's ancestors (by `parents`, pid to parent pid) is in `watched`."""
    pid, seen = candidate.ppid, set()
    while pid not in watched:
        if pid in seen or pid not in parents:
            return False
        seen.add(pid)
        pid = parents[pid]
    return True


def _runs(program: re.Pattern[str]) -> Callable[[Candidate], bool]:
    """Whether a process runs the engine's program: not a shell, debugger or launcher given its path or a script
    that names it (`processes.invocation`), whose port is not the server's; the server is the process it starts."""
    return lambda candidate: program.match(candidate.invocation) is not None


def _holders(gpu_pids: Iterable[int], parents: dict[int, int]) -> set[int]:
    """The processes holding GPU memory and all their ancestors (by `parents`, pid to parent pid): a server's ranks
    hold it, their parent is the main process."""
    out: set[int] = set()
    for pid in gpu_pids:
        while pid not in out and pid in parents:
            out.add(pid)
            pid = parents[pid]
        out.add(pid)
    return out


class Watcher:
    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic,
                 scan: Callable[[], list[Candidate]] = processes.scan, hold_logs: bool = False,
                 owner: Callable[[int], int | None] = processes.owner,
                 gpu_pids: Callable[[], Iterable[int]] = tuple) -> None:
        """`hold_logs`: a log follower reads the servers' logs, so each found server's log files are held open for
        it (`Server`). `owner`: the real uid of a process; `gpu_pids`: the processes that hold GPU memory now
        (NVML's last readings; none without NVML), whose uid is a configured server's owner (`_main_process`)."""
        self.config = config
        self._hold_logs = hold_logs
        self._clock = clock
        self._scan = scan
        self._owner, self._gpu_pids = owner, gpu_pids
        self._owners: dict[str, int] = {}  # configured servers without `match.user`: the uid that held GPU memory
        self._gone: dict[str, float] = {}  # discovered servers whose process is gone: since when (clock)
        self._lock = threading.Lock()
        self._servers: dict[str, Server] = {}
        self._table = ProcessTable(config.paths.procfs, TREE_CACHE_SECONDS)  # one read for every server's tree
        self._listeners: list[Callable[[list[Server]], None]] = []
        self._stop = threading.Event()
        self._next_refresh = 0.0
        self._collisions: set[str] = set()
        self._capped: set[str | None] = set()  # tenants (None: all) whose cap was logged, until under it again
        self.skipped = 0  # processes with an engine's command line left unwatched by the caps, in the last pass
        self._skipping = 0  # the same, counted in the pass under way
        for index, spec in enumerate(config.servers):
            name = spec.name or _default_name(spec, index)
            self._servers[name] = Server(name, spec, config, self._table, configured=True,
                                        hold_logs=hold_logs)
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
        candidates = self._scan()
        claimed: set[int] = set()
        changed = False
        parents = {c.pid: c.ppid for c in candidates}
        holders: set[int] | None = None  # read at the first configured server that needs it
        for server in self._configured:
            pattern = server.spec.cmdline
            if pattern is not None:
                roots = _roots(candidates, lambda c, p=pattern: p.search(c.cmdline) is not None)
            else:
                assert server.engine.program is not None  # config validation guarantees one
                roots = _roots(candidates, _runs(server.engine.program))
            roots = [c for c in roots if c.pid not in claimed]
            if roots and holders is None and server.spec.user is None and server.name not in self._owners:
                holders = _holders(self._gpu_pids(), parents)
            main = self._main_process(server, roots, holders or set())
            if main is not None:
                claimed.add(main.pid)
                changed |= self._attach(server, main)
        self._skipping = 0
        if self.config.discovery.enabled:
            # Every engine's matches first: a process in the tree of a watched server, whatever its engine, is part of
            # it (Ollama's `llama-server` runners, a worker forked with its parent's argv), never a server of its own.
            found = [(engine, c) for engine in ENGINES.values() if engine.program is not None
                     for c in filter(_runs(engine.program), candidates)]
            watched = claimed | {c.pid for _, c in found}
            for engine, root in found:
                if root.pid not in claimed and not _inside(root, watched, parents) and not self._rank(engine, root):
                    claimed.add(root.pid)
                    changed |= self._discovered(engine, root)
        self.skipped = self._skipping
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

    def _main_process(self, server: Server, roots: list[Candidate], holders: set[int]) -> Candidate | None:
        """Which of a configured server's matches (oldest first) is its main process: only one of its owner's, the
        configured `match.user` or else the uid of the first match seen holding GPU memory (kept for good: a copy of
        its argv that another user starts first, or while it is down, never becomes it, so InferenceServerDown fires
        and no relaunch is counted for the copy; audit 2026-12-02 #5). Until a match has held GPU memory, the first
        match is followed. The process followed stays while it lives: an older match never replaces it."""
        owner = server.spec.user if server.spec.user is not None else self._owners.get(server.name)
        if owner is None:
            holder = next((c for c in roots if c.pid in holders), None)
            uid = self._owner(holder.pid) if holder is not None else None
            if uid is not None:
                owner = self._owners[server.name] = uid
                log.info("server %s is uid %d's: its pid %d holds GPU memory", server.name, uid, holder.pid)
        if owner is not None:
            roots = [c for c in roots if self._owner(c.pid) == owner]
        key = server.launch.key
        return next((c for c in roots if ProcessKey(c.pid, c.create_time) == key), roots[0] if roots else None)

    def _attach(self, server: Server, candidate: Candidate) -> bool:
        if server.follows(candidate):
            return False
        return server.attach(candidate, locate(self.config.paths, candidate.pid), self._owner(candidate.pid))

    def _rank(self, engine: Engine, root: Candidate) -> bool:
        """Whether the process is a rank above 0 of a server its MPI launcher starts once per rank
        (`Engine.rank_env`): rank 0 is the server."""
        if not engine.rank_env:
            return False
        return (engine.mpi_rank(read_environ(self.config.paths.procfs, root.pid, engine.rank_env)) or 0) > 0

    def _discovered(self, engine: Engine, root: Candidate) -> bool:
        key = ProcessKey(root.pid, root.create_time)
        with self._lock:
            following = next((s for s in self._servers.values() if s.launch.key == key), None)
        if following is not None:
            return self._attach(following, root)  # anew only when it exec'd
        workload = locate(self.config.paths, root.pid)
        with self._lock:
            uid = self._owner(root.pid)
            name = self._name(engine, root, workload, uid)
            server = self._servers.get(name)
            if server is None:
                if self._over_cap(root, tenant(workload, uid)):
                    self._skipping += 1
                    return False
                spec = ServerSpec(engine=engine.name, stall=self.config.defaults.stall)
                server = self._servers[name] = Server(name, spec, self.config, self._table, hold_logs=self._hold_logs)
                log.info("discovered %s server %s (pid %d, %s)", engine.name, name, root.pid, workload.runtime)
        return server.attach(root, workload, uid)

    def _over_cap(self, root: Candidate, owner: str) -> bool:
        """Whether a new discovered server would pass `discovery.max_servers` or, for its tenant (`tenant`),
        `max_servers_per_user` (logged once per cap until it is no longer reached). Only running servers count: a
        gone one keeps its name and series until forgotten, but not its slot (audit 2026-12-02 #10); when the
        entries reach `max_servers`, the one gone longest is forgotten now to make room."""
        discovered = {name: s for name, s in self._servers.items() if name not in self._configured_names}
        running = [s for s in discovered.values() if s.is_running()]
        limits = ((None, len(running), self.config.discovery.max_servers),
                  (owner, sum(1 for s in running if tenant(s.launch.workload, s.launch.uid) == owner),
                   self.config.discovery.max_servers_per_user))
        for who, watched, limit in limits:
            if watched < limit:
                self._capped.discard(who)
                continue
            if who not in self._capped:
                self._capped.add(who)
                log.warning("not watching pid %d and later processes %s: %d running discovered servers are the cap "
                            "(discovery.%s)", root.pid, "in all" if who is None else f"of {who}", limit,
                            "max_servers" if who is None else "max_servers_per_user")
            return True
        if len(discovered) >= self.config.discovery.max_servers:
            now = self._clock()
            gone = [name for name, s in discovered.items() if not s.is_running()]
            oldest = min(gone, key=lambda name: self._gone.get(name, now))
            del self._servers[oldest]
            self._gone.pop(oldest, None)
            log.info("forgot server %s: its process is gone and a new server needs its slot", oldest)
        return False

    def _name(self, engine: Engine, root: Candidate, workload: Workload, uid: int | None) -> str:
        """A name unique on the node and stable across restarts of the same workload: a server by that name
        whose process is gone is the same workload restarted; one whose process lives is another server."""
        keys = tuple(key for key in (engine.address_env, engine.port_env) if key)
        environ = read_environ(self.config.paths.procfs, root.pid, keys) if keys else {}
        port = engine.listen_address(root.argv, environ)[1]
        # A server without a port (a Dynamo worker without DYN_SYSTEM_PORT, an Xinference model process) by its model.
        tail = port if port is not None else engine.model(root.argv).rstrip("/").rsplit("/", 1)[-1] or "none"
        name = printable(workload.name or f"{engine.name}-{tail}")
        if workload.name is None:
            name = self._host_name(name, root, uid)
        if self._taken(name, workload, uid) and workload.pod:
            name = f"{name}/{workload.container}"  # a second server in one pod
        base, suffix = name, 1
        while self._taken(name, workload, uid):
            suffix += 1
            name = f"{base}-{suffix}"
        if suffix > 1 and base not in self._collisions:
            self._collisions.add(base)
            log.warning("two servers would be named %s; the later one (pid %d) is %s", base, root.pid, name)
        return name

    def _host_name(self, name: str, root: Candidate, uid: int | None) -> str:
        """A host process's name where users collide on `<engine>-<port>` (audit 2026-12-02 #11): the plain name
        is root's, and another user's process is `<name>@uid<N>` beside a server of another uid's. So a neighbour
        that starts first holds the plain name only until root's server comes: its entry, running or gone, is
        forgotten then (a running one is found again as `@uid<N>` at the next pass), never the other way round: a
        neighbour's copy never takes over a gone root server's name (its InferenceServerDown)."""
        holder = self._servers.get(name)
        if holder is None or name in self._configured_names or holder.launch.key is None \
                or holder.launch.workload.runtime != "host" or uid is None or holder.launch.uid == uid:
            return name
        if uid == 0:
            del self._servers[name]
            self._gone.pop(name, None)
            log.warning("server %s is root's pid %d: the process of uid %s that held the name is renamed",
                        name, root.pid, holder.launch.uid)
            return name
        return f"{name}@uid{uid}"

    def _taken(self, name: str, workload: Workload, uid: int | None) -> bool:
        """Whether `name` belongs to another server: a configured one (never handed to a discovered process, which
        would keep InferenceServerDown from firing while its own process is down), a running one, or a gone one
        that the candidate cannot be a relaunch of (another user's process squatting the name in the gap)."""
        server = self._servers.get(name)
        if server is None:
            return False
        return name in self._configured_names or server.is_running() or not server.relaunched_as(workload, uid)

    def check_liveness(self) -> None:
        """A main process that is gone ends its phase now, not at the next scrape or discovery pass."""
        for server in self.servers():
            if server.launch.process is not None and not server.is_running():
                server.interpreter.process_gone()

    def start(self) -> None:
        self.refresh(notify=True)
        self._next_refresh = self._clock() + self.config.discovery.interval
        run_every(min(LIVENESS_SECONDS, self.config.discovery.interval), self._tick, "process discovery", self._stop,
                  delay_first=True)

    def stop(self) -> None:
        self._stop.set()

    def _tick(self) -> None:
        self.check_liveness()
        if self._clock() >= self._next_refresh:
            self._next_refresh = self._clock() + self.config.discovery.interval
            self.refresh()


def tenant(workload: Workload, uid: int | None) -> str:
    """Whose a discovered server is, for its share of the caps: its pod, container or unit, and only for a host
    process its uid (every root container runs as uid 0 on the host: one tenant's would fill root's share)."""
    if workload.runtime == "kubernetes":
        if workload.pod:
            return f"pod {workload.namespace}/{workload.pod}"
        return f"container {short_id(workload.container_id)}"
    if workload.runtime == "docker":
        return f"container {short_id(workload.container_id)}"
    if workload.runtime == "systemd" and workload.unit:
        return f"unit {workload.unit}"
    return f"uid {uid}"


def _default_name(spec: ServerSpec, index: int) -> str:
    engine = ENGINES[spec.engine]
    port: int | None = engine.default_port
    if spec.probes:
        port = urlsplit(spec.probes[0].url).port or port
    return f"{spec.engine}-{port}" if port is not None else f"{spec.engine}-{index}"
