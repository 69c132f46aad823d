"""The root collector: runs each source's collector in isolation and reports on each.

A source whose `collect()` raises contributes nothing to the scrape except
`stallwatch_collector_success{collector="<name>"} 0`; `/metrics` still answers 200.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from stallwatch import __version__
from stallwatch.metrics import family
from stallwatch.servers import Watcher

log = logging.getLogger(__name__)


class Source(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class StallwatchCollector(Collector):
    def __init__(self, watcher: Watcher, sources: Mapping[str, Source]) -> None:
        self.watcher = watcher
        self.sources = dict(sources)
        self._failing: dict[str, str] = {}

    def describe(self) -> list[Metric]:
        return []  # keep registration from running a scrape

    def collect(self) -> Iterator[Metric]:
        success = family("collector_success")
        duration = family("collector_duration_seconds")
        for name, source in self.sources.items():
            start = time.perf_counter()
            try:
                metrics = list(source.collect())
                ok = True
            except Exception as exc:
                metrics, ok = [], False
                self._report(name, exc)
            else:
                if self._failing.pop(name, None) is not None:
                    log.info("collector %s recovered", name)
            yield from (m for m in metrics if m.samples)
            success.add_metric([name], 1.0 if ok else 0.0)
            duration.add_metric([name], time.perf_counter() - start)
        yield success
        yield duration
        yield from self._thresholds()
        build = family("build_info")
        build.add_metric([__version__], 1.0)
        yield build

    def _report(self, name: str, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if self._failing.get(name) == message:
            log.debug("collector %s failed again: %s", name, message)
        else:
            log.error("collector %s failed: %s", name, message, exc_info=exc)
        self._failing[name] = message

    def _thresholds(self) -> Iterator[Metric]:
        memory = family("stall_gpu_memory_threshold_bytes")
        stale = family("stall_log_stale_threshold_seconds")
        for server in self.watcher.servers():
            memory.add_metric([server.name], server.spec.stall.gpu_memory_bytes)
            stale.add_metric([server.name], server.spec.stall.log_stale)
        yield memory
        yield stale
