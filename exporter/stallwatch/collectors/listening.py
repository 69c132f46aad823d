"""Listening collector: whether the engine's port has a LISTEN socket in the server's own network namespace,
as the discovery loop last read it from `/proc/PID/net/tcp{,6}` (no network, no privilege). It separates a
server whose port never opened (the startup stall) from one that listens but does not answer."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.watcher import Watcher


class ListeningCollector:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        metric = family("server_listening")
        for server in self.watcher.servers():
            launch = server.launch
            binds, port = launch.listening, launch.port
            if binds is not None and port is not None:
                metric.add_metric([server.name, str(port)], 1.0 if binds else 0.0)
        yield metric


COLLECTOR = Registration("listening", CollectorSettings, lambda runtime, _: ListeningCollector(runtime.watcher),
                         "whether each server's port listens, in its own network namespace")
