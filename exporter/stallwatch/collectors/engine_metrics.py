"""Engine metrics collector: requests running and waiting and tokens generated, as the engine itself reports them
(`source="metrics"`: its `/metrics` page, fetched in the background by `signals.engine_page`; `source="log"`:
its periodic stats lines, read by the log followers), whether its page answered, whether the engine's main
loop answered it (for a page that loop serves), and the GPU memory each model it has loaded holds (Ollama's
`/api/ps`, `signals.loaded_models`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.discovery.watcher import Watcher
from stallwatch.engines.base import Figures
from stallwatch.runtime import required
from stallwatch.signals.engine_page import EngineMetricsSettings, EnginePageManager

FIGURES = ("engine_requests_running", "engine_requests_waiting", "engine_generated_tokens_total",
           "engine_stats_timestamp_seconds")


class EngineMetricsCollector:
    def __init__(self, manager: EnginePageManager, watcher: Watcher) -> None:
        self.manager, self.watcher = manager, watcher

    def collect(self) -> Iterator[Metric]:
        families = [family(name) for name in FIGURES]
        up, loop_up = family("engine_metrics_up"), family("engine_loop_up")
        models = family("engine_model_gpu_memory_bytes")
        for state in self.manager.states():
            for model, memory in sorted((state.models or {}).items()):
                models.add_metric([state.server, model], memory)
            if state.up is not None:
                up.add_metric([state.server], 1.0 if state.up else 0.0)
            if state.loop_up is not None:
                loop_up.add_metric([state.server], 1.0 if state.loop_up else 0.0)
            if state.figures is not None:
                _add(families, [state.server, "metrics"], state.figures)
        for server in self.watcher.servers():
            look = server.look()
            if look.log.figures is not None:
                _add(families, [look.name, "log"], look.log.figures)
        yield from (*families, up, loop_up, models)


def _add(families: list[Metric], labels: list[str], figures: Figures) -> None:
    for metric, value in zip(families, (figures.running, figures.waiting, figures.tokens, figures.at), strict=True):
        metric.add_metric(labels, value)


COLLECTOR = Registration(
    "engine_metrics", EngineMetricsSettings,
    lambda runtime, _: EngineMetricsCollector(required(runtime.engine_pages, "engine_metrics"), runtime.watcher),
    "each engine's own requests and generated tokens, from its /metrics page or stats lines")
