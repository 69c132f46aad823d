"""Phase collector: each server's startup phase from its log, process and probes, and shard progress."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.engines import PHASES
from stallwatch.metrics import family
from stallwatch.prober import ProbeManager
from stallwatch.servers import Watcher


class PhaseCollector:
    def __init__(self, watcher: Watcher, probes: ProbeManager | None) -> None:
        self.watcher, self.probes = watcher, probes

    def collect(self) -> Iterator[Metric]:
        phase_family, since_family = family("startup_phase"), family("startup_phase_start_timestamp_seconds")
        loaded, expected = family("weight_shards_loaded"), family("weight_shards_expected")
        last_success: dict[str, float] = {}
        for state in self.probes.states() if self.probes is not None else []:
            if state.last_success is not None:
                last_success[state.server] = max(last_success.get(state.server, 0.0), state.last_success)
        for server in self.watcher.servers():
            tracker = server.tracker
            if server.main is not None and not server.is_running():
                tracker.process_gone()
            elif server.name in last_success:
                tracker.probe_succeeded(last_success[server.name])
            now = tracker.snapshot()
            for name in PHASES:
                phase_family.add_metric([server.name, name], 1.0 if name == now.phase else 0.0)
            since_family.add_metric([server.name], now.since)
            if now.shards_expected is not None:
                loaded.add_metric([server.name], float(now.shards_loaded or 0))
                expected.add_metric([server.name], float(now.shards_expected))
        yield from (phase_family, since_family, loaded, expected)
