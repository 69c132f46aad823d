"""Thresholds collector: each server's stall thresholds from config, so one rule file serves every server."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.watcher import Watcher


class ThresholdsCollector:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        memory = family("stall_gpu_memory_threshold_bytes")
        stale = family("stall_log_stale_threshold_seconds")
        for server in self.watcher.servers():
            memory.add_metric([server.name], server.spec.stall.gpu_memory_bytes)
            stale.add_metric([server.name], server.spec.stall.log_stale)
        yield from (memory, stale)


COLLECTOR = Registration("thresholds", CollectorSettings, lambda runtime, _: ThresholdsCollector(runtime.watcher),
                         "each server's stall thresholds from config")
