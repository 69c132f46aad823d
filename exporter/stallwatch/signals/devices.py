"""One GPU's reading through NVML, and what is derived from it: its identity, read once while it answers
(`identify`: handle, UUID, name, PCI address), its memory, utilization and processes (`read_device`), its busy
seconds integrated from NVML's utilization samples (`BusyIntegrator`, so that bursts between two scrapes are not
lost), and the memory a server holds on it (`server_memory`). The calls here may block as long as the driver does:
only `signals.nvml`'s reader threads make them."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml

from stallwatch.discovery.server import Look

MAX_SAMPLE_SECONDS = 1.0  # NVML's sample period is 1/6 s to 1 s; a longer gap means samples were lost
T = TypeVar("T")


REMAPPED_ROWS = ("correctable", "uncorrectable", "pending", "failure")  # `nvmlDeviceGetRemappedRows`, in order


@dataclass(frozen=True)
class Health:
    """The cheap health fields of one GPU; each None where the GPU does not support it (absent, never zero)."""

    power_watts: float | None = None
    power_limit_watts: float | None = None  # enforced
    energy_joules: float | None = None  # since the driver loaded (Volta+)
    recovery_action: float | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node reboot...
    ecc_uncorrected: float | None = None  # volatile: since the driver loaded
    remapped_rows: dict[str, float] | None = None  # REMAPPED_ROWS -> rows (pending, failure: 0/1)
    pcie_replays: float | None = None
    # `nvmlDeviceGetCurrentClocksEventReasons` as it comes: a bitmask of `nvmlClocksEventReason*` (one series, as
    # dcgm-exporter's, not one per reason)
    clock_event_reasons: float | None = None


@dataclass
class Device:
    index: str
    uuid: str
    name: str
    used: float
    total: float
    utilization: float | None
    processes: dict[int, float] | None  # pid -> bytes; None when NVML cannot list them
    busy_ratio: float | None = None  # mean utilization over NVML's buffer of recent samples (None: no samples)
    busy_window: float = 0.0  # the span of those samples, seconds
    health: Health = field(default_factory=Health)
    pci: str | None = None  # "0000:cb:00", the kernel log's form of its PCI address (`pci_address`)


def pci_address(domain: int, bus: int, device: int) -> str:
    """A GPU's PCI address as the driver's kernel log lines write it (`NVRM: Xid (PCI:0000:cb:00): ...`)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}"


@dataclass(frozen=True)
class DeviceFailure:
    """A device that did not answer: its index, its UUID when it was ever read (`Identity`), and why. `last`: its
    last reading that answered, for the reports to say who held memory on it (never exported as current values)."""

    index: str
    uuid: str
    error: pynvml.NVMLError
    last: Device | None = None


@dataclass
class Devices:
    """The last reading of every device. `up`: NVML answered (else `error` says why, and there is nothing
    else)."""

    up: bool
    error: str = ""
    known: bool = True  # False: not read yet (the exporter just started): nothing to say either way
    expected: bool = True  # False: NVML is missing on a node that shows no NVIDIA GPU (`nvml.shows_nvidia_gpu`)
    driver: str = ""
    devices: list[Device] = field(default_factory=list)
    failed: list[DeviceFailure] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # readers that failed other than by NVML's word (a bug)

    def holders(self) -> set[int]:
        """The processes that hold GPU memory on a device that answered."""
        return {pid for d in self.devices for pid, held in (d.processes or {}).items() if held > 0}


@dataclass
class BusyIntegrator:
    """Busy seconds of one GPU, from NVML samples (percent over the period ending at a µs timestamp), and the
    samples of the span NVML buffers (what its first answer from time 0 held), for the reports' recent mean."""

    busy_seconds: float = 0.0
    last_sample_us: int = 0
    last_fallback: float | None = None
    recent: deque[tuple[int, float]] = field(default_factory=deque)
    buffer_us: int | None = None  # the span of NVML's buffer, from its first answer

    def add_samples(self, samples: list[tuple[int, float]]) -> None:
        ordered = sorted(samples)
        if self.buffer_us is None and ordered:
            self.buffer_us = ordered[-1][0] - ordered[0][0]
        for timestamp_us, percent in ordered:
            if timestamp_us <= self.last_sample_us:
                continue
            if self.last_sample_us:
                period = min((timestamp_us - self.last_sample_us) / 1e6, MAX_SAMPLE_SECONDS)
                self.busy_seconds += period * min(max(percent, 0.0), 100.0) / 100.0
            self.last_sample_us = timestamp_us
            self.recent.append((timestamp_us, percent))
        while self.recent and self.buffer_us is not None and self.recent[0][0] < self.last_sample_us - self.buffer_us:
            self.recent.popleft()

    def recent_busy(self) -> tuple[float | None, float]:
        """Mean utilization over the buffer's span of samples, and that span in seconds (None, 0: none)."""
        span = (self.recent[-1][0] - self.recent[0][0]) / 1e6 if self.recent else 0.0
        if span <= 0:
            return None, 0.0
        window = BusyIntegrator()
        window.add_samples(list(self.recent))
        return min(1.0, window.busy_seconds / span), span  # the sum of the samples' shares can round above 1

    def add_rate(self, now: float, percent: float) -> None:
        """Fallback where samples are not supported: the current rate held since the previous tick."""
        if self.last_fallback is not None:
            period = min(now - self.last_fallback, MAX_SAMPLE_SECONDS * 5)
            self.busy_seconds += max(period, 0.0) * min(max(percent, 0.0), 100.0) / 100.0
        self.last_fallback = now


@dataclass(frozen=True)
class Identity:
    """What a GPU is, read once while it answers: a GPU that hangs later (Xid 119) keeps its name, and none of this
    is asked of it again. `generation`: the NVML initialisation its handle belongs to (a fresh init, a fresh one)."""

    index: int
    handle: Any
    uuid: str
    name: str
    pci: str | None
    generation: int


def identify(index: int, generation: int) -> Identity:
    """GPU `index`'s handle, UUID, name and PCI address; NVMLError when it does not answer."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return Identity(index=index, handle=handle, uuid=as_str(pynvml.nvmlDeviceGetUUID(handle)),
                    name=as_str(pynvml.nvmlDeviceGetName(handle)),
                    pci=_optional(lambda: _pci(pynvml.nvmlDeviceGetPciInfo(handle))), generation=generation)


def read_device(identity: Identity, integrator: Callable[[str], BusyIntegrator]) -> Device:
    """One device's memory, utilization and processes under its `identity` (no call asks who it is), with its
    utilization samples added to `integrator(uuid)`; NVMLError when it does not answer."""
    handle = identity.handle
    busy = integrator(identity.uuid)
    _sample(handle, busy)
    ratio, window = busy.recent_busy()
    memory = _memory(handle)
    return Device(
        index=str(identity.index),
        uuid=identity.uuid,
        name=identity.name,
        used=float(memory.used),
        total=float(memory.total),
        utilization=_optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0),
        processes=_optional(lambda: {
            p.pid: float(p.usedGpuMemory or 0)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        }),
        busy_ratio=ratio,
        busy_window=window,
        health=read_health(handle),
        pci=identity.pci,
    )


def _pci(info: Any) -> str:
    return pci_address(int(info.domain), int(info.bus), int(info.device))


def read_health(handle: object) -> Health:
    """Power, energy, the driver's recovery action, ECC, remapped rows, PCIe replays and clock event reasons."""
    remapped = _optional(lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
    return Health(
        power_watts=_optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        power_limit_watts=_optional(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0),
        energy_joules=_optional(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0),
        recovery_action=_optional(lambda: _field(handle, pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)),
        ecc_uncorrected=_optional(lambda: float(pynvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))),
        remapped_rows=None if remapped is None else dict(zip(REMAPPED_ROWS, map(float, remapped), strict=True)),
        pcie_replays=_optional(lambda: float(pynvml.nvmlDeviceGetPcieReplayCounter(handle))),
        clock_event_reasons=_optional(lambda: float(_clock_event_reasons(handle))),
    )


def _clock_event_reasons(handle: object) -> int:
    """The current reasons; `...ThrottleReasons` on drivers before `...ClocksEventReasons` (deprecated since)."""
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except pynvml.NVMLError_FunctionNotFound:
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


_FIELD_VALUE = {  # `c_nvmlFieldValue_t.valueType` -> the member of its `value` union that holds it
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
}


def _field(handle: object, field_id: int) -> float:
    """One field value; NotSupported (as `_optional` expects) when the field itself says it failed."""
    value = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])[0]
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return float(getattr(value.value, _FIELD_VALUE.get(value.valueType, "ullVal")))


def server_memory(look: Look, devices: list[Device]) -> list[tuple[Device, float]]:
    """The memory the server holds on each device it uses: its listed GPUs whole (containers without hostPID
    see other pids), else what NVML lists for its tree's processes."""
    gpus = look.spec.gpus
    if gpus is not None:
        return [(device, device.used) for device in devices if int(device.index) in gpus]
    pids = {s.pid for s in look.tree}
    out = []
    for device in devices:
        if device.processes is None or not pids:
            continue
        held = [b for pid, b in device.processes.items() if pid in pids]
        if held:
            out.append((device, sum(held)))
    return out


def _sample(handle: object, integrator: BusyIntegrator) -> None:
    """Add the samples NVML took since the last ones (all it buffers, the first time)."""
    try:
        _, samples = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES,
                                                 integrator.last_sample_us)
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_NoPermission):
        return  # no sample newer than the last (or none for us to read)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        integrator.add_rate(time.monotonic(), pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        return
    integrator.add_samples([(int(s.timeStamp), float(s.sampleValue.uiVal)) for s in samples])


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
