"""GPU collector: per-device identity, memory, utilization and busy seconds, and the memory that each
watched server's processes hold on each GPU. A failing device is reported as down, never as stale."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.discovery.watcher import Watcher
from stallwatch.runtime import required
from stallwatch.signals.devices import Device, DeviceFailure, server_memory
from stallwatch.signals.nvml import GpuSettings, Nvml


class GpuCollector:
    def __init__(self, nvml: Nvml, watcher: Watcher) -> None:
        self.nvml = nvml
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        nvml_up = family("nvml_up")
        found = self.nvml.read_devices()  # the readers' last readings: no NVML call in a scrape
        if found.broken:
            raise RuntimeError("; ".join(found.broken))
        if found.known:
            nvml_up.add_metric([], 1.0 if found.up else 0.0)
        yield nvml_up
        if not found.up:
            return
        info, up = family("gpu_info"), family("gpu_up")
        used, total = family("gpu_memory_used_bytes"), family("gpu_memory_total_bytes")
        utilization, busy = family("gpu_utilization_ratio"), family("gpu_busy_seconds_total")
        everything: list[Device | DeviceFailure] = [*found.devices, *found.failed]
        for device in sorted(everything, key=lambda d: int(d.index)):
            labels = [device.index, device.uuid]
            if isinstance(device, DeviceFailure):
                up.add_metric(labels, 0.0)
                continue
            up.add_metric(labels, 1.0)
            info.add_metric([*labels, device.name, found.driver], 1.0)
            used.add_metric(labels, device.used)
            total.add_metric(labels, device.total)
            if device.utilization is not None:
                utilization.add_metric(labels, device.utilization)
            seconds = self.nvml.busy_seconds(device.uuid)
            if seconds is not None:
                busy.add_metric(labels, seconds)
        yield from (info, up, used, total, utilization, busy)
        yield self._server_memory(found.devices)

    def _server_memory(self, devices: list[Device]) -> Metric:
        metric = family("server_gpu_memory_used_bytes")
        for server in self.watcher.servers():
            for device, held in server_memory(server, devices):
                metric.add_metric([server.name, device.index, device.uuid], held)
        return metric


COLLECTOR = Registration(
    "gpu", GpuSettings, lambda runtime, _: GpuCollector(required(runtime.nvml, "gpu"), runtime.watcher),
    "GPU memory, utilization and busy seconds through NVML")
