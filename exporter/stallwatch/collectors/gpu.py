"""GPU collector: per-device identity, memory, utilization and busy seconds, and the memory that each
watched server's processes hold on each GPU. A failing device is reported as down, never as stale."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pynvml
from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import positive_duration
from stallwatch.discovery.server import Server
from stallwatch.discovery.watcher import Watcher
from stallwatch.metrics import family
from stallwatch.nvml import Nvml, as_str

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Device:
    index: str
    uuid: str
    name: str
    used: float
    total: float
    utilization: float | None
    processes: dict[int, float] | None  # pid -> bytes; None when NVML cannot list them


class GpuCollector:
    def __init__(self, nvml: Nvml, watcher: Watcher) -> None:
        self.nvml = nvml
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        nvml_up = family("nvml_up")
        if not self.nvml.available():
            nvml_up.add_metric([], 0.0)
            yield nvml_up
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = as_str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            self.nvml.lost(exc)
            nvml_up.add_metric([], 0.0)
            yield nvml_up
            return
        nvml_up.add_metric([], 1.0)
        yield nvml_up

        info, up = family("gpu_info"), family("gpu_up")
        used, total = family("gpu_memory_used_bytes"), family("gpu_memory_total_bytes")
        utilization, busy = family("gpu_utilization_ratio"), family("gpu_busy_seconds_total")
        devices: list[Device] = []
        for index in range(count):
            device = self._read(index, up)
            if device is None:
                continue
            devices.append(device)
            labels = [device.index, device.uuid]
            up.add_metric(labels, 1.0)
            info.add_metric([*labels, device.name, driver], 1.0)
            used.add_metric(labels, device.used)
            total.add_metric(labels, device.total)
            if device.utilization is not None:
                utilization.add_metric(labels, device.utilization)
            seconds = self.nvml.busy_seconds(device.uuid)
            if seconds is not None:
                busy.add_metric(labels, seconds)
        yield from (info, up, used, total, utilization, busy)
        yield self._server_memory(devices)

    def _read(self, index: int, up: Metric) -> Device | None:
        try:
            return read_device(index)
        except pynvml.NVMLError as exc:
            level = logging.WARNING if isinstance(exc, pynvml.NVMLError_GpuIsLost) else logging.DEBUG
            log.log(level, "GPU %d did not answer: %s: %s", index, type(exc).__name__, exc)
            up.add_metric([str(index), getattr(exc, "uuid", "")], 0.0)
            self.nvml.lost(exc)
            return None

    def _server_memory(self, devices: list[Device]) -> Metric:
        metric = family("server_gpu_memory_used_bytes")
        for server in self.watcher.servers():
            for device, held in server_memory(server, devices):
                metric.add_metric([server.name, device.index, device.uuid], held)
        return metric


def read_device(index: int) -> Device:
    """One device's identity, memory, utilization and processes; NVMLError (with `uuid` set once known) when it
    does not answer."""
    uuid = ""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = as_str(pynvml.nvmlDeviceGetUUID(handle))
        name = as_str(pynvml.nvmlDeviceGetName(handle))
        memory = _memory(handle)
        return Device(
            index=str(index),
            uuid=uuid,
            name=name,
            used=float(memory.used),
            total=float(memory.total),
            utilization=_optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
            processes=_optional(lambda: {
                p.pid: float(p.usedGpuMemory or 0)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            }),
        )
    except pynvml.NVMLError as exc:
        exc.uuid = uuid  # type: ignore[attr-defined]
        raise


def server_memory(server: Server, devices: list[Device]) -> list[tuple[Device, float]]:
    """The memory the server holds on each device it uses: its listed GPUs whole (containers without hostPID
    see other pids), else what NVML lists for its tree's processes."""
    gpus = server.spec.gpus
    if gpus is not None:
        return [(device, device.used) for device in devices if int(device.index) in gpus]
    pids = {s.pid for s in server.tree()}
    out = []
    for device in devices:
        if device.processes is None or not pids:
            continue
        held = [b for pid, b in device.processes.items() if pid in pids]
        if held:
            out.append((device, sum(held)))
    return out


def _memory(handle: object) -> Any:
    """v2 memory info (used excludes reserved) where the driver has it, else v1."""
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported,
            pynvml.NVMLError_ArgumentVersionMismatch):
        return pynvml.nvmlDeviceGetMemoryInfo(handle)


def _optional(read: Callable[[], T]) -> T | None:
    """A field some GPUs lack (MIG, old drivers): omitted, never reported as zero."""
    try:
        return read()
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NoPermission):
        return None


@dataclass(frozen=True)
class GpuSettings(CollectorSettings):
    sample_interval: float = setting(positive_duration, 1.0)  # how often utilization samples are integrated


COLLECTOR = Registration(
    "gpu", GpuSettings, lambda context, settings: GpuCollector(
        context.run(Nvml(settings.sample_interval)), context.watcher),
    "GPU memory, utilization and busy seconds through NVML")
