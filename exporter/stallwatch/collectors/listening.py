"""Listening collector: whether the engine's port has a LISTEN socket in the server's own network namespace,
read from its `/proc/PID/net/tcp{,6}` (no network, no privilege). It separates a server whose port never
opened (the startup stall) from one that listens but does not answer."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.config import CollectorSettings
from stallwatch.metrics import family
from stallwatch.netns import listening
from stallwatch.servers import Watcher


class ListeningCollector:
    def __init__(self, watcher: Watcher, procfs: str) -> None:
        self.watcher, self.procfs = watcher, procfs

    def collect(self) -> Iterator[Metric]:
        metric = family("server_listening")
        for server in self.watcher.servers():
            key, port = server.main_key, server.port
            if key is None or port is None or not server.is_running():
                continue
            binds = listening(self.procfs, key.pid, port)
            if binds is not None:
                metric.add_metric([server.name, str(port)], 1.0 if binds else 0.0)
        yield metric


COLLECTOR = Registration(
    "listening", CollectorSettings, lambda context, _: ListeningCollector(context.watcher, context.config.paths.procfs),
    "whether each server's port listens, in its own network namespace")
