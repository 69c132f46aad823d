"""A fake `pynvml` for tests: the real nvidia-ml-py module with its device calls replaced.

Put this folder first on PYTHONPATH and set STALLWATCH_FAKE_NVML to a JSON scenario file. Everything that
is not a device call (the NVMLError classes, constants, ctypes structures) is the real module's own, so
the exporter's production code path runs unchanged. The scenario is re-read when the file changes, so a
test can lose a GPU or load one mid-run:

    {"driver": "550.54.15", "missing": false,
     "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "total": 85899345920, "used": 76e9,
               "util": 0, "lost": false, "unsupported": ["utilization", "samples", "memory_v2", "processes"],
               "processes": [{"pid": 1234, "used": 76e9}], "block": 0}]}

Health fields, each NotSupported while its key is absent: `power` and `power_limit` (W), `energy` (J when the fake
loaded; it grows by `power` per second), `recovery_action`, `ecc_uncorrected`, `remapped_rows` ([correctable,
uncorrectable, pending, failure]), `pcie_replays`, `clock_reasons` (the event-reason bitmask). `pci`: its PCI
address as the kernel log writes it ("0000:3b:00"; default bus 0x18 + its index).
Events: `"events": [{"id": 1, "gpu": 2, "type": "xid", "data": 79}]` at the top level, each delivered once, to an
event set that registered its GPU (`type`: xid, unavailable, recovery); `"wait_errors": N`: the first N waits fail
with NVML_ERROR_UNKNOWN.

`block`: seconds every call on that GPU (its index, UUID and memory too: the handle's) waits before it fails with
NVML_ERROR_TIMEOUT, as when its firmware stops answering (Xid 119, a GSP RPC timeout: each call waits ~45 s,
NVIDIA/open-gpu-kernel-modules#446); a call answers as soon as the scenario lifts `block` (the GPU answers again).
Event waits do not block (the C fake of ../shared/fakenvml neither: the driver's event fds are not the GPU's RPCs).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys
import time
from typing import NoReturn

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "pynvml", [p for p in sys.path if os.path.abspath(p or ".") != _here])
assert _spec is not None and _spec.loader is not None, "nvidia-ml-py is not installed"
_real = importlib.util.module_from_spec(_spec)
# The real module generates its NVMLError_* classes on `sys.modules["pynvml"]`: let that be itself meanwhile.
_fake = sys.modules["pynvml"]
sys.modules["pynvml"] = _real
try:
    _spec.loader.exec_module(_real)
finally:
    sys.modules["pynvml"] = _fake
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})

SAMPLE_PERIOD_US = 166_667  # NVML samples utilization every 1/6 s on recent GPUs
_BUFFERED_SAMPLES = 120
_cache: dict[str, object] = {"mtime": None, "scenario": {}}
_initialised = False
_LOADED = time.time()
_EVENT_TYPES = {"xid": _real.nvmlEventTypeXidCriticalError, "unavailable": _real.nvmlEventTypeGpuUnavailableError,
                "recovery": _real.nvmlEventTypeGpuRecoveryAction}


def _scenario() -> dict:
    path = os.environ.get("STALLWATCH_FAKE_NVML", "")
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        return {"missing": True}
    if mtime != _cache["mtime"]:
        try:
            with open(path) as handle:
                _cache["scenario"] = json.load(handle)
            _cache["mtime"] = mtime
        except ValueError:  # caught mid-write by the test: keep the last complete scenario
            pass
    return _cache["scenario"]  # type: ignore[return-value]


def _fail(code: int) -> NoReturn:
    raise _real.NVMLError(code)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def _gpu(handle: _Handle, field: str | None = None) -> dict:
    if not _initialised:
        _fail(_real.NVML_ERROR_UNINITIALIZED)
    gpus = _scenario().get("gpus", [])
    if handle.index >= len(gpus):
        _fail(_real.NVML_ERROR_GPU_IS_LOST)
    gpu = gpus[handle.index]
    if gpu.get("block"):
        gpu = _blocked(handle.index, float(gpu["block"]))
    if gpu.get("lost"):
        _fail(_real.NVML_ERROR_GPU_IS_LOST)
    if field is not None and field in gpu.get("unsupported", []):
        _fail(_real.NVML_ERROR_NOT_SUPPORTED)
    return gpu


def _blocked(index: int, seconds: float) -> dict:
    """Wait as a call on a GPU whose firmware does not answer: NVML_ERROR_TIMEOUT after `seconds`, or the GPU's
    scenario once `block` is lifted."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        gpus = _scenario().get("gpus", [])
        if index >= len(gpus):
            _fail(_real.NVML_ERROR_GPU_IS_LOST)
        if not gpus[index].get("block"):
            return gpus[index]
    _fail(_real.NVML_ERROR_TIMEOUT)


def nvmlInit() -> None:
    global _initialised
    if _scenario().get("missing"):
        _fail(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
    _initialised = True


def nvmlShutdown() -> None:
    global _initialised
    _initialised = False


def nvmlSystemGetDriverVersion() -> str:
    if not _initialised:
        _fail(_real.NVML_ERROR_UNINITIALIZED)
    return _scenario().get("driver", "550.54.15")


def nvmlDeviceGetCount() -> int:
    if not _initialised:
        _fail(_real.NVML_ERROR_UNINITIALIZED)
    if _scenario().get("missing"):
        _fail(_real.NVML_ERROR_DRIVER_NOT_LOADED)
    return len(_scenario().get("gpus", []))


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    handle = _Handle(index)
    _gpu(handle)
    return handle


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return _gpu(handle).get("uuid", f"GPU-00000000-0000-0000-0000-{handle.index:012d}")


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _gpu(handle).get("name", "NVIDIA H100 80GB HBM3")


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None):
    gpu = _gpu(handle, "memory_v2" if version else None)
    total, used = int(gpu.get("total", 85_899_345_920)), int(float(gpu.get("used", 0)))
    if version:
        memory = _real.c_nvmlMemory_v2_t()
        memory.version = version
        memory.reserved = 0
    else:
        memory = _real.c_nvmlMemory_t()
    memory.total, memory.used, memory.free = total, used, total - used
    return memory


def nvmlDeviceGetUtilizationRates(handle: _Handle):
    gpu = _gpu(handle, "utilization")
    util = _real.c_nvmlUtilization_t()
    util.gpu, util.memory = int(gpu.get("util", 0)), int(gpu.get("memory_util", 0))
    return util


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list:
    gpu = _gpu(handle, "processes")
    out = []
    for proc in gpu.get("processes", []):
        info = _real.c_nvmlProcessInfo_v3_t()
        info.pid = int(proc["pid"])
        info.usedGpuMemory = int(float(proc.get("used", 0)))
        info.gpuInstanceId = info.computeInstanceId = 0xFFFFFFFF
        out.append(_real.nvmlStructToFriendlyObject(info))
    return out


def nvmlDeviceGetSamples(handle: _Handle, sampling_type: int, timeStamp: int):
    """Utilization samples every 1/6 s up to now, at the scenario's current utilization."""
    gpu = _gpu(handle, "samples")
    now_us = int(time.time() * 1e6)
    first = max(timeStamp + 1, now_us - _BUFFERED_SAMPLES * SAMPLE_PERIOD_US)
    first += (-first) % SAMPLE_PERIOD_US  # align on the sample grid
    samples = []
    for stamp in range(first, now_us + 1, SAMPLE_PERIOD_US):
        sample = _real.c_nvmlSample_t()
        sample.timeStamp = stamp
        sample.sampleValue.uiVal = int(gpu.get("sample_util", gpu.get("util", 0)))  # a burst the rate missed
        samples.append(sample)
    if not samples:
        _fail(_real.NVML_ERROR_NOT_FOUND)
    return (_real.NVML_VALUE_TYPE_UNSIGNED_INT, samples)


def _health(handle: _Handle, key: str) -> object:
    gpu = _gpu(handle)
    if key not in gpu or key in gpu.get("unsupported", []):
        _fail(_real.NVML_ERROR_NOT_SUPPORTED)
    return gpu[key]


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    return int(float(_health(handle, "power")) * 1000)  # mW


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    return int(float(_health(handle, "power_limit")) * 1000)


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    joules = float(_health(handle, "energy")) + float(_gpu(handle).get("power", 0)) * (time.time() - _LOADED)
    return int(joules * 1000)  # mJ


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    return int(_health(handle, "ecc_uncorrected"))


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    return tuple(int(v) for v in _health(handle, "remapped_rows"))  # type: ignore[return-value, union-attr]


def nvmlDeviceGetPcieReplayCounter(handle: _Handle) -> int:
    return int(_health(handle, "pcie_replays"))


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    return int(_health(handle, "clock_reasons"))


def nvmlDeviceGetFieldValues(handle: _Handle, field_ids: list[int]):
    """The real shape: one `c_nvmlFieldValue_t` per field, each with its own `nvmlReturn`."""
    gpu = _gpu(handle)
    values = (_real.c_nvmlFieldValue_t * len(field_ids))()
    for value, field_id in zip(values, field_ids, strict=True):
        value.fieldId = field_id
        if field_id == _real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and "recovery_action" in gpu:
            value.nvmlReturn, value.valueType = _real.NVML_SUCCESS, _real.NVML_VALUE_TYPE_UNSIGNED_INT
            value.value.uiVal = int(gpu["recovery_action"])
        else:
            value.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
    return values


def nvmlDeviceGetPciInfo(handle: _Handle):
    """`pci` ("0000:3b:00", the kernel log's form), else bus 0x18 + the GPU's index."""
    gpu = _gpu(handle, "pci")
    domain, bus, device = (int(part, 16) for part in gpu.get("pci", f"0000:{0x18 + handle.index:02x}:00").split(":"))
    info = _real.nvmlPciInfo_t()
    info.domain, info.bus, info.device = domain, bus, device
    info.busId = f"{domain:08X}:{bus:02X}:{device:02X}.0".encode()
    return info


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    _gpu(handle)
    return handle.index


# -- events: what `nvmlEventSetWait_v2` returns, one scenario event at a time --------------------------------------

class _EventSet:
    def __init__(self) -> None:
        self.masks: dict[int, int] = {}  # GPU index -> registered event types


_delivered: set[object] = set()  # event ids: a set made after one was delivered does not get it again, as NVML's
_wait_failures = 0  # of `wait_errors`, so far


class _EventData:
    """The fields of `c_nvmlEventData_t` that callers read; `device` is the fake's handle."""

    def __init__(self, device: _Handle, event_type: int, data: int) -> None:
        self.device, self.eventType, self.eventData = device, event_type, data
        self.gpuInstanceId = self.computeInstanceId = 0xFFFFFFFF


def nvmlEventSetCreate() -> _EventSet:
    if not _initialised:
        _fail(_real.NVML_ERROR_UNINITIALIZED)
    return _EventSet()


def nvmlDeviceGetSupportedEventTypes(handle: _Handle) -> int:
    mask = 0
    for name in _gpu(handle).get("event_types", list(_EVENT_TYPES)):
        mask |= _EVENT_TYPES[name]
    return mask


def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: _EventSet) -> None:
    _gpu(handle)
    event_set.masks[handle.index] = event_set.masks.get(handle.index, 0) | event_types


def nvmlEventSetWait_v2(event_set: _EventSet, timeoutms: int) -> _EventData:
    global _wait_failures
    if _wait_failures < int(_scenario().get("wait_errors", 0)):
        _wait_failures += 1
        _fail(_real.NVML_ERROR_UNKNOWN)
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        for event in _scenario().get("events", []):
            key, gpu, kind = event.get("id"), int(event["gpu"]), _EVENT_TYPES[event.get("type", "xid")]
            if key not in _delivered and event_set.masks.get(gpu, 0) & kind:
                _delivered.add(key)
                return _EventData(_Handle(gpu), kind, int(event.get("data", 0)))
        if time.monotonic() >= deadline:
            _fail(_real.NVML_ERROR_TIMEOUT)
        time.sleep(0.05)


def nvmlEventSetFree(event_set: _EventSet) -> None:
    event_set.masks.clear()
