"""Engine metrics collector: requests running and waiting and tokens generated, as the engine itself reports them
(`source="metrics"`: its `/metrics` page, fetched in the background by `stallwatch.enginemetrics`; `source="log"`:
its periodic stats lines, read by the log followers), and whether its page answered."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import Metric

from stallwatch.collectors.base import Context, Registration
from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import positive_duration
from stallwatch.discovery.watcher import Watcher
from stallwatch.enginemetrics import EngineMetricsManager
from stallwatch.engines.base import Figures
from stallwatch.metrics import family

FIGURES = ("engine_requests_running", "engine_requests_waiting", "engine_generated_tokens_total",
           "engine_stats_timestamp_seconds")


class EngineMetricsCollector:
    def __init__(self, manager: EngineMetricsManager, watcher: Watcher) -> None:
        self.manager, self.watcher = manager, watcher

    def collect(self) -> Iterator[Metric]:
        families = [family(name) for name in FIGURES]
        up = family("engine_metrics_up")
        for state in self.manager.states():
            if state.up is not None:
                up.add_metric([state.server], 1.0 if state.up else 0.0)
            if state.figures is not None:
                _add(families, [state.server, "metrics"], state.figures)
        for server in self.watcher.servers():
            figures = server.interpreter.figures()
            if figures is not None:
                _add(families, [server.name, "log"], figures)
        yield from (*families, up)


def _add(families: list[Metric], labels: list[str], figures: Figures) -> None:
    for metric, value in zip(families, (figures.running, figures.waiting, figures.tokens, figures.at), strict=True):
        metric.add_metric(labels, value)


@dataclass(frozen=True)
class EngineMetricsSettings(CollectorSettings):
    interval: float = setting(positive_duration, 10.0)  # between fetches of one server's page
    timeout: float = setting(positive_duration, 5.0)  # one deadline for each fetch


def _build(context: Context, settings: EngineMetricsSettings) -> EngineMetricsCollector:
    manager = context.share(EngineMetricsManager(settings.interval, settings.timeout))
    context.watcher.on_change(manager.reconcile)
    return EngineMetricsCollector(manager, context.watcher)


COLLECTOR = Registration("engine_metrics", EngineMetricsSettings, _build,
                         "each engine's own requests and generated tokens, from its /metrics page or stats lines")
