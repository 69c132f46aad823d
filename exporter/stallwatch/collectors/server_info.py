"""Server info collector: what each server is (engine, model, tensor parallelism) and where it runs (pod,
container, unit), with the labels kube-state-metrics uses, so alerts and dashboards can say
"Kimi-K2.5, TP 8, llm/kimi-0"."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.watcher import Watcher


class ServerInfoCollector:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        info = family("server_info")
        for server in self.watcher.servers():
            launch = server.launch
            w = launch.workload
            info.add_metric([server.name, server.engine.name, launch.model, launch.tensor_parallel, w.runtime,
                             w.namespace, w.pod, w.container, w.container_id, w.unit], 1.0)
        yield info


COLLECTOR = Registration("server_info", CollectorSettings, lambda runtime, _: ServerInfoCollector(runtime.watcher),
                         "what each server is and where it runs (pod, container, unit)")
