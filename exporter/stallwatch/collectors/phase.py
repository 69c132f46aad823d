"""Phase collector: each server's startup phase and shard progress, as the background loops left them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.watcher import Watcher
from stallwatch.engines.base import PHASES


class PhaseCollector:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        phase_family, since_family = family("startup_phase"), family("startup_phase_start_timestamp_seconds")
        loaded, expected = family("weight_shards_loaded"), family("weight_shards_expected")
        for server in self.watcher.servers():
            look = server.look()
            now = look.log
            for name in PHASES:
                phase_family.add_metric([look.name, name], 1.0 if name == now.phase else 0.0)
            since_family.add_metric([look.name], now.since)
            if now.shards_expected is not None:
                loaded.add_metric([look.name], float(now.shards_loaded or 0))
                expected.add_metric([look.name], float(now.shards_expected))
        yield from (phase_family, since_family, loaded, expected)


COLLECTOR = Registration("phase", CollectorSettings, lambda runtime, _: PhaseCollector(runtime.watcher),
                         "startup phase of each server and its weight shard progress")
