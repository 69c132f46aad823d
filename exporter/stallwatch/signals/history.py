"""The last hour of each watched server, in memory, for its status page: GPU memory held, GPU utilization, log
lines read, CPU seconds of its processes and tokens generated, sampled every `web.history_interval`.

It reads what the other signals already keep (NVML, the log followers, the engine pages), so a status page needs
no Prometheus and adds no load on the engine. A signal that is off (its collector disabled) gives `None`
(unknown) in every point.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from stallwatch.discovery.processes import ProcessKey, cpu_totals
from stallwatch.discovery.server import Look
from stallwatch.discovery.watcher import Watcher
from stallwatch.engines.base import Figures
from stallwatch.loops import run_every
from stallwatch.signals.devices import Device, server_memory
from stallwatch.signals.engine_page import EnginePageManager, figures_of
from stallwatch.signals.logs import LogManager
from stallwatch.signals.nvml import Nvml

SPAN_SECONDS = 3600.0
CPU_KEEP_SECONDS = 180.0  # per-process CPU totals are only read about a minute back: older points drop them
NO_CPU: Mapping[ProcessKey, float] = MappingProxyType({})  # what an older point keeps: one for all of them


# Slots: an hour of points for each server stays in memory (without them, a point's `__dict__` is most of it).
@dataclass(frozen=True, slots=True)
class Point:
    at: float
    gpu_memory_bytes: float | None  # held by the server on all of its GPUs
    gpu_utilization: float | None  # of its busiest GPU, 0..1
    log_lines: int | None  # read from its logs so far
    cpu: Mapping[ProcessKey, float]  # CPU seconds (user + system) of each process of its tree so far; recent points
    tokens: tuple[str, float] | None  # (source, generated so far) as the engine reports: its metrics page or log


class History:
    """One ring of points per server, `span` long; rings of servers no longer watched are dropped."""

    def __init__(self, watcher: Watcher, interval: float, *, nvml: Nvml | None = None, logs: LogManager | None = None,
                 pages: EnginePageManager | None = None, span: float = SPAN_SECONDS,
                 wall: Callable[[], float] = time.time) -> None:
        self.watcher, self.nvml, self.logs, self.pages = watcher, nvml, logs, pages
        self.interval, self._wall = interval, wall
        self._size = max(2, int(span / interval) + 1)
        self._cpu_keep = max(CPU_KEEP_SECONDS, 3 * interval)
        self._rings: dict[str, deque[Point]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def points(self, server: str) -> list[Point]:
        with self._lock:
            return list(self._rings.get(server, ()))

    def sample_once(self) -> None:
        servers = self.watcher.servers()
        found = self.nvml.read_devices() if self.nvml is not None else None
        devices = found.devices if found is not None and found.up else None
        lines = self._log_lines()
        pages = {s.server: s for s in self.pages.states()} if self.pages is not None else {}
        now = self._wall()
        looks = [s.look() for s in servers]
        fresh = {look.name: _point(look, now, devices, lines, figures_of(look, pages.get(look.name))) for look in looks}
        with self._lock:
            for name in set(self._rings) - set(fresh):
                del self._rings[name]
            for name, point in fresh.items():
                ring = self._rings.setdefault(name, deque(maxlen=self._size))
                ring.append(point)
                self._drop_old_cpu(ring, now)

    def _drop_old_cpu(self, ring: deque[Point], now: float) -> None:
        """Most of a point's memory is its per-process CPU totals, which no one reads after a few minutes."""
        for index, point in enumerate(ring):
            if now - point.at <= self._cpu_keep:
                return
            if point.cpu:
                ring[index] = dataclasses.replace(point, cpu=NO_CPU)

    def _log_lines(self) -> dict[str, int] | None:
        if self.logs is None:
            return None
        lines: dict[str, int] = {}
        for stats in self.logs.stats():
            lines[stats.server] = lines.get(stats.server, 0) + stats.lines
        return lines

    def start(self) -> None:
        run_every(self.interval, self.sample_once, "status history sampler", self._stop)

    def stop(self) -> None:
        self._stop.set()


def _point(look: Look, now: float, devices: list[Device] | None, lines: dict[str, int] | None,
           figures: tuple[str, Figures | None]) -> Point:
    memory = utilization = None
    if devices is not None:
        held = server_memory(look, devices)
        memory = sum(b for _, b in held)
        busy = [d.utilization for d, _ in held if d.utilization is not None]
        utilization = max(busy) if busy else None
    source, found = figures
    return Point(
        at=now, gpu_memory_bytes=memory, gpu_utilization=utilization,
        log_lines=None if lines is None else lines.get(look.name, 0),
        cpu=cpu_totals(look.tree),
        tokens=(source, found.tokens) if found is not None else None)
