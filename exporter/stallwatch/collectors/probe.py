"""Probe collector: results of the HTTP probes that `signals.probes` runs in the background, by each probe's stable
name, and the URL each gets in `probe_info`."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.runtime import required
from stallwatch.signals.probes import REASONS, ProbeManager, ProbeSettings


class ProbeCollector:
    def __init__(self, manager: ProbeManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        success, duration = family("probe_success"), family("probe_duration_seconds")
        status, last = family("probe_http_status_code"), family("probe_last_success_timestamp_seconds")
        failures, where = family("probe_failures_total"), family("probe_info")
        for state in self.manager.states():
            labels = [state.server, state.name]
            where.add_metric([*labels, state.url], 1.0)
            for reason in REASONS:
                failures.add_metric([*labels, reason], float(state.failures[reason]))
            result = state.last
            if result is None:
                continue
            success.add_metric(labels, 1.0 if result.success else 0.0)
            duration.add_metric(labels, result.duration)
            status.add_metric(labels, float(result.status))
            if state.last_success is not None:
                last.add_metric(labels, state.last_success)
        yield from (where, success, duration, status, last, failures)


COLLECTOR = Registration("probe", ProbeSettings, lambda runtime, _: ProbeCollector(required(runtime.probes, "probe")),
                         "HTTP health probes of each server, in the background")
