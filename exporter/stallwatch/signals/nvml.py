"""NVML access: initialisation with backoff, reading every device (`Nvml.read_devices`, the one enumeration that
the GPU collector, the history and the reports share), the memory a server holds on each, and a light background
sampler that integrates GPU utilization into busy seconds, so that bursts between two scrapes are not lost."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import positive_duration
from stallwatch.discovery.server import Server
from stallwatch.loops import run_every

log = logging.getLogger(__name__)

MAX_SAMPLE_SECONDS = 1.0  # NVML's sample period is 1/6 s to 1 s; a longer gap means samples were lost
MAX_BACKOFF_SECONDS = 300.0
T = TypeVar("T")


@dataclass(frozen=True)
class GpuSettings(CollectorSettings):
    """The `gpu:` section."""

    sample_interval: float = setting(positive_duration, 1.0)  # how often utilization samples are integrated


@dataclass
class Device:
    index: str
    uuid: str
    name: str
    used: float
    total: float
    utilization: float | None
    processes: dict[int, float] | None  # pid -> bytes; None when NVML cannot list them


@dataclass(frozen=True)
class DeviceFailure:
    """A device that did not answer: its index, its UUID when it was read before the failure, and why."""

    index: str
    uuid: str
    error: pynvml.NVMLError


@dataclass
class Devices:
    """One read of every device. `up`: NVML answered (else `error` says why, and there is nothing else)."""

    up: bool
    error: str = ""
    driver: str = ""
    devices: list[Device] = field(default_factory=list)
    failed: list[DeviceFailure] = field(default_factory=list)


@dataclass
class BusyIntegrator:
    """Busy seconds of one GPU, from NVML samples (percent over the period ending at a µs timestamp)."""

    busy_seconds: float = 0.0
    last_sample_us: int = 0
    last_fallback: float | None = None

    def add_samples(self, samples: list[tuple[int, float]]) -> None:
        for timestamp_us, percent in sorted(samples):
            if timestamp_us <= self.last_sample_us:
                continue
            if self.last_sample_us:
                period = min((timestamp_us - self.last_sample_us) / 1e6, MAX_SAMPLE_SECONDS)
                self.busy_seconds += period * min(max(percent, 0.0), 100.0) / 100.0
            self.last_sample_us = timestamp_us

    def add_rate(self, now: float, percent: float) -> None:
        """Fallback where samples are not supported: the current rate held since the previous tick."""
        if self.last_fallback is not None:
            period = min(now - self.last_fallback, MAX_SAMPLE_SECONDS * 5)
            self.busy_seconds += max(period, 0.0) * min(max(percent, 0.0), 100.0) / 100.0
        self.last_fallback = now


class Nvml:
    """Owns NVML's lifecycle. `available()` says whether calls may be made now."""

    def __init__(self, sample_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.sample_interval = sample_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._initialised = False
        self._next_attempt = 0.0
        self._backoff = 1.0
        self._last_error: str | None = None
        self._busy: dict[str, BusyIntegrator] = {}  # by GPU UUID
        self._stop = threading.Event()

    def available(self) -> bool:
        with self._lock:
            if self._initialised:
                return True
            now = self._clock()
            if now < self._next_attempt:
                return False
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                self._next_attempt = now + self._backoff
                self._backoff = min(self._backoff * 2, MAX_BACKOFF_SECONDS)
                message = f"{type(exc).__name__}: {exc}"
                # Once per distinct error: a node without a driver must not fill the log.
                level = logging.DEBUG if message == self._last_error else logging.WARNING
                log.log(level, "NVML unavailable (%s); retrying in %.0fs", message, self._backoff)
                self._last_error = message
                return False
            self._initialised = True
            self._backoff = 1.0
            self._last_error = None
            log.info("NVML initialised, driver %s", as_str(pynvml.nvmlSystemGetDriverVersion()))
            return True

    def read_devices(self) -> Devices:
        """Every device's identity, memory, utilization and processes; a device that does not answer is listed
        in `failed`, never with stale values."""
        if not self.available():
            return Devices(False, "NVML unavailable (no driver, or no access to it)")
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = as_str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            self.lost(exc)
            return Devices(False, f"NVML: {exc}")
        out = Devices(True, driver=driver)
        for index in range(count):
            try:
                out.devices.append(read_device(index))
            except pynvml.NVMLError as exc:
                level = logging.WARNING if isinstance(exc, pynvml.NVMLError_GpuIsLost) else logging.DEBUG
                log.log(level, "GPU %d did not answer: %s: %s", index, type(exc).__name__, exc)
                out.failed.append(DeviceFailure(str(index), getattr(exc, "uuid", ""), exc))
                self.lost(exc)
        return out

    def lost(self, exc: pynvml.NVMLError) -> None:
        """A call failed in a way that calls for a fresh init (driver gone, library unloaded)."""
        if isinstance(exc, (pynvml.NVMLError_Uninitialized, pynvml.NVMLError_LibraryNotFound,
                            pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch)):
            with self._lock:
                if self._initialised:
                    log.warning("NVML stopped answering (%s); re-initialising", exc)
                    with contextlib.suppress(pynvml.NVMLError):
                        pynvml.nvmlShutdown()
                self._initialised = False

    def busy_seconds(self, uuid: str) -> float | None:
        with self._lock:
            integrator = self._busy.get(uuid)
            return integrator.busy_seconds if integrator else None

    def sample_once(self) -> None:
        if not self.available():
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.lost(exc)
            return
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = as_str(pynvml.nvmlDeviceGetUUID(handle))
                with self._lock:
                    integrator = self._busy.setdefault(uuid, BusyIntegrator())
                    since = integrator.last_sample_us
                self._sample_device(handle, integrator, since)
            except pynvml.NVMLError as exc:
                log.debug("utilization sample of GPU %d failed: %s", index, exc)
                self.lost(exc)

    def _sample_device(self, handle: object, integrator: BusyIntegrator, since: int) -> None:
        try:
            _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since)
        except pynvml.NVMLError_NotFound:
            return  # no sample newer than `since`
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            percent = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            with self._lock:
                integrator.add_rate(self._clock(), percent)
            return
        points = [(int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples]
        with self._lock:
            integrator.add_samples(points)

    def start(self) -> None:
        run_every(self.sample_interval, self.sample_once, "GPU utilization sampler", self._stop)

    def stop(self) -> None:
        self._stop.set()


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


def recent_busy(device: Device) -> tuple[float | None, float]:
    """Mean utilization over the samples NVML still buffers (`nvmlDeviceGetSamples` from time 0: up to a few
    minutes at its 1/6 to 1 s period) and their span, integrated as the sampler does."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.index))
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    except pynvml.NVMLError:
        return None, 0.0  # not supported (MIG, old GPUs), or no sample yet
    stamps = sorted((int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples)
    span = (stamps[-1][0] - stamps[0][0]) / 1e6 if stamps else 0.0
    if span <= 0:
        return None, 0.0
    integrator = BusyIntegrator()
    integrator.add_samples(stamps)
    return integrator.busy_seconds / span, span


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


def as_str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
