"""The report behind each server's status page, from what the running exporter already keeps: the same report as
`stallwatch diagnose` (`diagnose.assemble`), with CPU seconds and tokens over the last minute of `History`, the
background prober's last results and the engine metrics loop's last figures, so a page view sends nothing to the
server. Log lines and Python stacks are gathered only with `web.show_evidence`; stacks at most every
STACK_TTL_SECONDS per server, one `py-spy` run at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch import diagnose
from stallwatch.collectors.base import Context
from stallwatch.diagnose import (
    EngineInfo,
    GpuSection,
    Observation,
    PortInfo,
    ProbeInfo,
    ServerReport,
    StackGroup,
)
from stallwatch.discovery.server import Server
from stallwatch.enginemetrics import EngineMetricsManager
from stallwatch.engines.base import Figures
from stallwatch.history import History, Point
from stallwatch.nvml import Nvml
from stallwatch.prober import ProbeManager
from stallwatch.text import display

WINDOW_SECONDS = 60.0  # CPU seconds and tokens are reported over about the last minute
STACK_TTL_SECONDS = 30.0


@dataclass
class StatusView:
    report: ServerReport
    points: list[Point]
    evidence: bool


class StatusPages:
    """Builds a `StatusView` of a watched server on request; owns the history ring. With evidence on, each
    server keeps its log's tail (`Server.tail`) and the page runs `py-spy`."""

    def __init__(self, context: Context, wall: Callable[[], float] = time.time) -> None:
        self.context, self._wall = context, wall
        self.evidence = context.config.web.show_evidence
        self.history = context.run(History(context, context.config.web.history_interval, wall=wall))
        self._nvml = context.find(Nvml)  # None: the gpu collector is disabled, and NVML is left alone
        self._stacks: dict[str, tuple[float, list[StackGroup]]] = {}
        self._stack_lock = threading.Lock()

    def find(self, name: str) -> Server | None:
        """The server of that name; a name from an alert's label may be the printable form of the real one."""
        servers = self.context.watcher.servers()
        return next((s for s in servers if s.name == name), None) or next(
            (s for s in servers if display(s.name) == name), None)

    def view(self, server: Server) -> StatusView:
        points = self.history.points(server.name)
        now = self._wall()
        figures = self._figures(server)
        # One window for CPU and tokens: from a point whose tokens came the way they come now, where there is one
        # (the engine's page answers a few seconds after the first points were taken).
        same_source = [p for p in points if figures[1] is not None and p.tokens and p.tokens[0] == figures[0]]
        start = window_start(same_source or points, now)
        earlier = start.cpu if start is not None else {}
        processes = diagnose.processes_since(server, earlier, self.context.config.paths.procfs)
        seen = Observation(
            window=now - start.at if start is not None else 0.0,
            processes=processes,
            stacks=self._stacks_of(server, processes) if self.evidence else [],
            port=self._port(server),
            engine=self._engine(figures, start),
            gpu=diagnose.gpus(server, self._nvml) if self._nvml is not None else GpuSection(
                False, "the gpu collector is disabled"),
            log_lines=server.tail.lines() if self.evidence and server.tail is not None else [],
        )
        return StatusView(diagnose.assemble(server, seen), points, self.evidence)

    def _stacks_of(self, server: Server, processes: list[diagnose.ProcessInfo]) -> list[StackGroup]:
        with self._stack_lock:  # one py-spy round at a time: a page reload cannot pile them up
            taken, groups = self._stacks.get(server.name, (float("-inf"), []))
            if time.monotonic() - taken >= STACK_TTL_SECONDS:
                groups = diagnose.stacks(processes)
                self._stacks[server.name] = (time.monotonic(), groups)
            return groups

    def _port(self, server: Server) -> PortInfo:
        probes = []
        manager = self.context.find(ProbeManager)
        for state in manager.states() if manager is not None else []:
            if state.server != server.name:
                continue
            result = state.last
            if result is None:
                probes.append(ProbeInfo(state.url, None, 0, state.unreachable or "not made yet", 0.0))
            else:
                probes.append(ProbeInfo(state.url, result.success, result.status, result.reason or "",
                                        result.duration))
        launch = server.launch
        listening = None if launch.listening is None else bool(launch.listening)
        return PortInfo(launch.port, listening, list(launch.listening or ()), probes)

    def _figures(self, server: Server) -> tuple[str, Figures | None, str]:
        """The engine's figures as the collectors have them: (source, figures, why its page did not answer)."""
        manager = self.context.find(EngineMetricsManager)
        state = next((s for s in manager.states() if s.server == server.name), None) if manager else None
        error = state.error if state is not None else ""
        if state is not None and state.figures is not None:
            return "metrics", state.figures, error
        return "log", server.interpreter.figures(), error

    @staticmethod
    def _engine(found: tuple[str, Figures | None, str], start: Point | None) -> EngineInfo:
        source, figures, error = found
        if figures is None:
            return EngineInfo("", None, None, None, None, error)
        made = None
        if start is not None and start.tokens is not None and start.tokens[0] == source:
            made = figures.tokens - start.tokens[1]
        return EngineInfo(source, figures.running, figures.waiting, figures.tokens, made, error)


def window_start(points: list[Point], now: float) -> Point | None:
    """The newest point at least WINDOW_SECONDS old, else the oldest there is."""
    older = [p for p in points if now - p.at >= WINDOW_SECONDS]
    return older[-1] if older else (points[0] if points else None)


