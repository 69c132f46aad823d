"""The last hour of each watched server, in memory, for its status page: GPU memory held, GPU utilization, log
lines read, CPU seconds of its processes and tokens generated, sampled every `web.history_interval`.

It reads what the collectors' background parts already keep (NVML, the log followers, the engine metrics loops),
so a status page needs no Prometheus and adds no load on the engine. A part whose collector is disabled gives
`None` (unknown) in every point.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from stallwatch.collectors.base import Context
from stallwatch.collectors.gpu import Device, read_device, server_memory
from stallwatch.discovery.processes import ProcessKey
from stallwatch.discovery.server import Server
from stallwatch.enginemetrics import EngineMetricsManager
from stallwatch.logfollow import LogManager
from stallwatch.loops import run_every
from stallwatch.nvml import Nvml

log = logging.getLogger(__name__)

SPAN_SECONDS = 3600.0
CPU_KEEP_SECONDS = 180.0  # per-process CPU totals are only read about a minute back: older points drop them


@dataclass(frozen=True)
class Point:
    at: float
    gpu_memory_bytes: float | None  # held by the server on all of its GPUs
    gpu_utilization: float | None  # of its busiest GPU, 0..1
    log_lines: int | None  # read from its logs so far
    cpu: dict[ProcessKey, float]  # CPU seconds (user + system) of each process of its tree so far; recent points
    tokens: tuple[str, float] | None  # (source, generated so far) as the engine reports: its metrics page or log


class History:
    """One ring of points per server, `span` long; rings of servers no longer watched are dropped."""

    def __init__(self, context: Context, interval: float, span: float = SPAN_SECONDS,
                 wall: Callable[[], float] = time.time) -> None:
        self.context, self.interval, self._wall = context, interval, wall
        self._size = max(2, int(span / interval) + 1)
        self._cpu_keep = max(CPU_KEEP_SECONDS, 3 * interval)
        self._rings: dict[str, deque[Point]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def points(self, server: str) -> list[Point]:
        with self._lock:
            return list(self._rings.get(server, ()))

    def sample_once(self) -> None:
        servers = self.context.watcher.servers()
        devices = self._devices()
        lines = self._log_lines()
        tokens = self._engine_tokens()
        now = self._wall()
        fresh = {s.name: _point(s, now, devices, lines, tokens) for s in servers}
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
                ring[index] = dataclasses.replace(point, cpu={})

    def _devices(self) -> list[Device] | None:
        nvml = self.context.find(Nvml)
        if nvml is None or not nvml.available():
            return None
        devices = []
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                try:
                    devices.append(read_device(index))
                except pynvml.NVMLError as exc:
                    log.debug("GPU %d did not answer: %s", index, exc)  # the gpu collector reports it
        except pynvml.NVMLError as exc:
            nvml.lost(exc)
            return None
        return devices

    def _log_lines(self) -> dict[str, int] | None:
        logs = self.context.find(LogManager)
        if logs is None:
            return None
        lines: dict[str, int] = {}
        for stats in logs.stats():
            lines[stats.server] = lines.get(stats.server, 0) + stats.lines
        return lines

    def _engine_tokens(self) -> dict[str, float]:
        engine = self.context.find(EngineMetricsManager)
        return {} if engine is None else {s.server: s.figures.tokens for s in engine.states() if s.figures}

    def start(self) -> None:
        run_every(self.interval, self.sample_once, "status history sampler", self._stop)

    def stop(self) -> None:
        self._stop.set()


def _point(server: Server, now: float, devices: list[Device] | None, lines: dict[str, int] | None,
           tokens: dict[str, float]) -> Point:
    memory = utilization = None
    if devices is not None:
        held = server_memory(server, devices)
        memory = sum(b for _, b in held)
        busy = [d.utilization for d, _ in held if d.utilization is not None]
        utilization = max(busy) if busy else None
    figures = server.interpreter.figures()
    engine_tokens = ("metrics", tokens[server.name]) if server.name in tokens else (
        ("log", figures.tokens) if figures is not None else None)
    return Point(
        at=now, gpu_memory_bytes=memory, gpu_utilization=utilization,
        log_lines=None if lines is None else lines.get(server.name, 0),
        cpu={ProcessKey(s.pid, s.create_time): s.cpu_user + s.cpu_system for s in server.tree()},
        tokens=engine_tokens)
