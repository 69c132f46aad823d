"""Logs collector: per log (its stable name) size, bytes, lines, backlog, skipped bytes, sharing, growth time and
readability, and where it is in `log_info`; notable events per server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.discovery.watcher import Watcher
from stallwatch.runtime import required
from stallwatch.signals.logs import LogManager, LogsSettings


class LogsCollector:
    def __init__(self, manager: LogManager, watcher: Watcher, wall: Callable[[], float] = time.time) -> None:
        self.manager, self.watcher, self._wall = manager, watcher, wall

    def collect(self) -> Iterator[Metric]:
        up, size = family("log_up"), family("log_size_bytes")
        read, lines = family("log_read_bytes_total"), family("log_lines_total")
        last, age = family("log_last_line_timestamp_seconds"), family("log_last_line_age_seconds")
        backlog, skipped = family("log_backlog_bytes"), family("log_skipped_bytes_total")
        shared, where = family("log_shared"), family("log_info")
        self.manager.check()
        now = self._wall()
        for stats in self.manager.stats():
            labels = [stats.server, stats.log]
            where.add_metric([*labels, stats.path], 1.0)
            up.add_metric(labels, 1.0 if stats.up else 0.0)
            if stats.size is not None:
                size.add_metric(labels, float(stats.size))
            read.add_metric(labels, float(stats.read_bytes))
            lines.add_metric(labels, float(stats.lines))
            backlog.add_metric(labels, float(stats.backlog))
            skipped.add_metric(labels, float(stats.skipped_bytes))
            shared.add_metric(labels, 1.0 if stats.shared else 0.0)
            if stats.last_growth is not None:
                last.add_metric(labels, stats.last_growth)
                age.add_metric(labels, max(0.0, now - stats.last_growth))
        events, progress = family("log_events_total"), family("log_last_progress_timestamp_seconds")
        last_event = family("log_last_event_timestamp_seconds")
        for server in self.watcher.servers():
            look = server.look()
            for event, count in sorted(look.log.events.items()):
                events.add_metric([look.name, event], float(count))
            for event, at in sorted(look.log.last_events.items()):
                last_event.add_metric([look.name, event], at)
            if look.log.progress is not None:
                progress.add_metric([look.name], look.log.progress)
        yield from (where, up, size, read, lines, backlog, skipped, shared, last, age, events, last_event, progress)


COLLECTOR = Registration(
    "logs", LogsSettings, lambda runtime, _: LogsCollector(required(runtime.logs, "logs"), runtime.watcher),
    "log growth, lines and notable events of each server")
