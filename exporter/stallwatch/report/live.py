"""The report behind each server's status page, from what the running exporter already keeps: the same report as
`stallwatch diagnose` (`observe.assemble`), with CPU seconds and tokens over the last minute of the history ring,
the background prober's last results and the engine page loop's last figures, so a page view sends nothing to the
server. Log lines and Python stacks are gathered only with `web.show_evidence`; stacks at most every
STACK_TTL_SECONDS per server, by one background `py-spy` round per server at a time: a page waits for it at most
STACK_WAIT_SECONDS (a hostile tree's round takes py-spy's whole timeout), then shows the last stacks taken, and
never waits for another server's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stallwatch.discovery.server import Look, Server
from stallwatch.report.model import Observation, ProbeInfo, ProcessInfo, ServerReport, StackGroup
from stallwatch.report.observe import (
    assemble,
    engine_info,
    gpu_section,
    made_in_window,
    pd_info,
    port_info,
    probe_info,
    processes_since,
)
from stallwatch.report.stacks import stacks
from stallwatch.runtime import Runtime
from stallwatch.signals.engine_page import figures_of
from stallwatch.signals.history import Point
from stallwatch.signals.pd_groups import group_keys, node_name
from stallwatch.text import display

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60.0  # CPU seconds and tokens are reported over about the last minute
STACK_TTL_SECONDS = 30.0
STACK_WAIT_SECONDS = 2.0  # what a page view waits for a round under way; an ordinary tree takes well under it


@dataclass
class _StackRound:
    """A server's last stacks and the py-spy round that is taking the next ones, if any."""

    taken: float = float("-inf")
    groups: list[StackGroup] = field(default_factory=list)
    running: threading.Thread | None = None


@dataclass
class StatusView:
    report: ServerReport
    points: list[Point]
    evidence: bool


class StatusPages:
    """Builds a `StatusView` of a watched server on request. With evidence on, each server keeps its log's tail
    (`Server.tail`) and the page runs `py-spy`."""

    def __init__(self, runtime: Runtime, wall: Callable[[], float] = time.time) -> None:
        self.runtime, self._wall = runtime, wall
        self.evidence = runtime.config.web.show_evidence
        self._stacks: dict[str, _StackRound] = {}  # per server, as long as it is watched
        self._stacks_lock = threading.Lock()

    def find(self, name: str) -> Server | None:
        """The server of that name; a name from an alert's label may be the printable form of the real one."""
        servers = self.runtime.watcher.servers()
        return next((s for s in servers if s.name == name), None) or next(
            (s for s in servers if display(s.name) == name), None)

    def view(self, server: Server) -> StatusView:
        runtime = self.runtime
        look = server.look()
        points = runtime.history.points(look.name) if runtime.history is not None else []
        now = self._wall()
        page = runtime.engine_pages.state(server) if runtime.engine_pages is not None else None
        source, figures = figures_of(look, page)
        # One window for CPU and tokens: from a point whose tokens came the way they come now, where there is one
        # (the engine's page answers a few seconds after the first points were taken).
        same_source = [p for p in points if figures is not None and p.tokens and p.tokens[0] == source]
        start = window_start(same_source or points, now)
        processes = processes_since(look.tree, start.cpu if start is not None else {}, runtime.config.paths.procfs)
        seen = Observation(
            window=now - start.at if start is not None else 0.0,
            processes=processes,
            stacks=self._stacks_of(look.name, processes) if self.evidence else [],
            port=port_info(look.launch, self._probes(look.name)),
            engine=engine_info((source, figures), made_in_window(start.tokens if start is not None else None,
                                                                 (source, figures)),
                               page.error if page is not None else "", page.models if page is not None else None),
            gpu=gpu_section(look, runtime),
            log_lines=server.tail.lines() if self.evidence and server.tail is not None else [],
            pd=pd_info(look, page, *self._group(look)),
        )
        return StatusView(assemble(look, seen), points, self.evidence)

    def _group(self, look: Look) -> tuple[str, str]:
        """The server's PD group and role as the PD collector exports them (its routers' pages read on this node)."""
        if look.launch.pd is None:
            return "", ""
        runtime = self.runtime
        states = {s.server: s for s in runtime.engine_pages.states()} if runtime.engine_pages is not None else {}
        keys = group_keys([s.look() for s in runtime.watcher.servers()], states, node_name())
        return keys.get(look.name, ("", ""))

    def _stacks_of(self, name: str, processes: list[ProcessInfo]) -> list[StackGroup]:
        """The server's stacks: taken anew in the background when older than STACK_TTL_SECONDS (one round per
        server at a time, so reloads cannot pile rounds up), waited for at most STACK_WAIT_SECONDS."""
        with self._stacks_lock:
            entry = self._round(name)
            if entry.running is None and time.monotonic() - entry.taken >= STACK_TTL_SECONDS:
                entry.running = threading.Thread(target=self._take, args=(entry, processes),
                                                 name=f"stacks of {name}", daemon=True)
                entry.running.start()
            running = entry.running
        if running is not None:
            running.join(STACK_WAIT_SECONDS)
        with self._stacks_lock:
            return entry.groups

    def _take(self, entry: _StackRound, processes: list[ProcessInfo]) -> None:
        groups: list[StackGroup] | None = None
        try:
            groups = stacks(processes)
        except Exception:
            log.exception("stacks of %s failed", [p.pid for p in processes])
        with self._stacks_lock:
            if groups is not None:
                entry.groups, entry.taken = groups, time.monotonic()
            entry.running = None

    def _round(self, name: str) -> _StackRound:
        """The server's stack round (under `_stacks_lock`); those of servers no longer watched are dropped."""
        watched = {s.name for s in self.runtime.watcher.servers()}
        for gone in set(self._stacks) - watched:
            del self._stacks[gone]
        return self._stacks.setdefault(name, _StackRound())

    def _probes(self, name: str) -> list[ProbeInfo]:
        prober = self.runtime.probes
        return [probe_info(state.url, state.last, state.unreachable or "not made yet")
                for state in (prober.states() if prober is not None else []) if state.server == name]


def window_start(points: list[Point], now: float) -> Point | None:
    """The newest point at least WINDOW_SECONDS old, else the oldest there is."""
    older = [p for p in points if now - p.at >= WINDOW_SECONDS]
    return older[-1] if older else (points[0] if points else None)
