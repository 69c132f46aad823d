"""The registered collectors, and the root collector that runs each in isolation and reports on each.

A collector whose `collect()` raises contributes nothing to the scrape except
`stallwatch_collector_success{collector="<name>"} 0`; `/metrics` still answers 200. A collector's detail families
(catalog `detail`) and its duration come only when its details are on (`<name>.details`).
Adding a collector: one module with a `COLLECTOR = Registration(...)`, one line in `REGISTRY`, and (when it
reads a new background signal) that signal's field in `runtime.Runtime`, made in `app.build`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from stallwatch.collectors import (
    build_info,
    deployment,
    engine_metrics,
    gpu,
    listening,
    logs,
    pd,
    phase,
    probe,
    process,
    server_info,
    thresholds,
)
from stallwatch.collectors.base import MetricSource, Registration
from stallwatch.collectors.catalog import detail_names, family
from stallwatch.config import CollectorSettings, Config
from stallwatch.runtime import Runtime
from stallwatch.text import printable

log = logging.getLogger(__name__)

REGISTRY: tuple[Registration, ...] = (
    gpu.COLLECTOR,
    process.COLLECTOR,
    server_info.COLLECTOR,
    deployment.COLLECTOR,
    pd.COLLECTOR,
    listening.COLLECTOR,
    probe.COLLECTOR,
    engine_metrics.COLLECTOR,
    logs.COLLECTOR,
    phase.COLLECTOR,
    thresholds.COLLECTOR,
    build_info.COLLECTOR,
)


def sections() -> dict[str, type[CollectorSettings]]:
    """Each collector's config section: its name and settings class, for the config reader."""
    return {registration.name: registration.settings for registration in REGISTRY}


class StallwatchCollector(Collector):
    def __init__(self, sources: Mapping[str, MetricSource], details: frozenset[str] = frozenset()) -> None:
        """`details`: the collectors whose detail families and duration are exported."""
        self.sources = dict(sources)
        self.details = details
        self._detail_names = detail_names()
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
            detailed = name in self.details
            yield from (_printable(m) for m in metrics
                        if m.samples and (detailed or m.name not in self._detail_names))
            success.add_metric([name], 1.0 if ok else 0.0)
            if detailed:
                duration.add_metric([name], time.perf_counter() - start)
        yield success
        if duration.samples:
            yield duration

    def _report(self, name: str, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if self._failing.get(name) == message:
            log.debug("collector %s failed again: %s", name, message)
        else:
            log.error("collector %s failed: %s", name, message, exc_info=exc)
        self._failing[name] = message


def _printable(metric: Metric) -> Metric:
    """Label values come from other processes (titles, paths, pod and container names): bytes that are not
    UTF-8 arrive surrogate-escaped and would fail the exposition's encoding, turning the scrape into a 500."""
    for i, sample in enumerate(metric.samples):
        if not all(value.isascii() for value in sample.labels.values()):
            labels = {key: printable(value) for key, value in sample.labels.items()}
            metric.samples[i] = sample._replace(labels=labels)
    return metric


def with_details(config: Config, flags: Mapping[str, bool | None]) -> Config:
    """The config with each `--[no-]collector.<name>.details` flag given (not None) over its `<name>.details`."""
    sections = dict(config.collectors)
    for registration in REGISTRY:
        flag = flags.get(registration.name)
        if flag is not None:
            settings = config.collector(registration.name, registration.settings)
            sections[registration.name] = dataclasses.replace(settings, details=flag)
    return dataclasses.replace(config, collectors=sections)


def enabled(config: Config, flags: Mapping[str, bool | None]) -> dict[str, CollectorSettings]:
    """The settings of each collector that is on: its `--[no-]collector.<name>` flag, else (None) the config's
    `<name>.enabled`."""
    out: dict[str, CollectorSettings] = {}
    for registration in REGISTRY:
        settings = config.collector(registration.name, registration.settings)
        flag = flags.get(registration.name)
        if settings.enabled if flag is None else flag:
            out[registration.name] = settings
    return out


def asked(config: Config, flags: Mapping[str, bool | None]) -> set[str]:
    """The collectors that are on because they were asked for by name, not by default: `--collector.<name>`, or
    `<name>: {enabled: true}` in the file."""
    return {name for name in enabled(config, flags) if flags.get(name) or name in config.enabled_in_file}


def build(runtime: Runtime) -> StallwatchCollector:
    """The root collector over the collectors that are on (`runtime.collectors`), each built from the runtime
    and its settings."""
    on = runtime.collectors
    return StallwatchCollector({r.name: r.build(runtime, on[r.name]) for r in REGISTRY if r.name in on},
                               frozenset(name for name, settings in on.items() if settings.details))
