"""The GPU collector, from NVML's snapshot: whether NVML answered (`stallwatch_nvml_up`) and whether it is expected
to on this node (`stallwatch_nvml_expected`), so that a CPU-only node is told from a GPU node whose driver is broken;
nothing of either before NVML's first survey. Each GPU's Xids with the servers that hold, or held, memory on it."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from stallwatch.collectors.gpu import GpuCollector
from stallwatch.signals.devices import Device, DeviceFailure, Devices, Health
from stallwatch.signals.nvml import NO_GPU, UNAVAILABLE
from stallwatch.signals.xid import XidCount


def _values(found: Devices) -> dict[str, list[float]]:
    nvml = SimpleNamespace(read_devices=lambda: found)
    watcher = SimpleNamespace(servers=lambda: [])
    families = GpuCollector(nvml, watcher).collect()  # type: ignore[arg-type]
    return {f.name: [s.value for s in f.samples] for f in families}


@pytest.mark.parametrize(("found", "up", "expected"), [
    (Devices(True, driver="550.54.15"), [1.0], [1.0]),  # a GPU node
    (Devices(False, UNAVAILABLE), [0.0], [1.0]),  # a GPU node whose driver is broken: StallwatchNvmlDown fires
    (Devices(False, NO_GPU, expected=False), [0.0], [0.0]),  # a CPU-only node: it does not
    (Devices(False, "NVML not read yet", known=False), [], []),  # just started: nothing to say either way
])
def test_nvml_up_and_expected(found: Devices, up: list[float], expected: list[float]) -> None:
    values = _values(found)
    assert (values["stallwatch_nvml_up"], values["stallwatch_nvml_expected"]) == (up, expected)


def _device(index: int, processes: dict[int, float], recovery: float = 0.0) -> Device:
    return Device(str(index), f"GPU-{index}", "NVIDIA H200", sum(processes.values()), 141e9, 0.0, processes,
                  health=Health(recovery_action=recovery))


def _server(name: str, *pids: int) -> SimpleNamespace:
    look = SimpleNamespace(name=name, spec=SimpleNamespace(gpus=None), tree=[SimpleNamespace(pid=p) for p in pids])
    return SimpleNamespace(look=lambda: look)


def test_faults_are_written_with_the_servers_that_hold_or_held_memory_on_the_gpu() -> None:
    """Each GPU's Xids with the servers that hold memory on it now, and, for a GPU that does not answer (Xid 119: its
    calls block), with the servers of its last reading that answered; never with a server that left a GPU that still
    answers, nor for a GPU nobody holds. A recovery action that asks for something, with the servers that hold memory
    on the GPU (the fault page reads these families, not a join of every GPU's memory)."""
    found = Devices(True, driver="580.65.06", devices=[
        _device(0, {10: 76e9}, recovery=2.0),
        _device(2, {30: 40e9}),  # `left` (pid 20) held memory here once; qwen does now
        _device(3, {}, recovery=1.0),
    ], failed=[DeviceFailure("1", "GPU-1", pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT), last=_device(1, {11: 70e9}))])
    xids = SimpleNamespace(counts=lambda: [
        XidCount("0", "GPU-0", "13", 1, 100.0), XidCount("1", "GPU-1", "119", 1, 200.0),
        XidCount("2", "GPU-2", "48", 2, 300.0), XidCount("3", "GPU-3", "79", 1, 400.0)])
    nvml = SimpleNamespace(read_devices=lambda: found, busy_seconds=lambda uuid: None)
    watcher = SimpleNamespace(servers=lambda: [_server("kimi", 10, 11), _server("left", 20), _server("qwen", 30)])
    families = {f.name: f for f in GpuCollector(nvml, watcher, xids).collect()}  # type: ignore[arg-type]
    written = {(s.labels["server"], s.labels["gpu"], s.labels["uuid"], s.labels["xid"], s.value)
               for s in families["stallwatch_server_gpu_xid_last_timestamp_seconds"].samples}
    assert written == {("kimi", "0", "GPU-0", "13", 100.0), ("kimi", "1", "GPU-1", "119", 200.0),
                       ("qwen", "2", "GPU-2", "48", 300.0)}
    assert [(s.labels["server"], s.labels["gpu"], s.value)
            for s in families["stallwatch_server_gpu_recovery_action"].samples] == [("kimi", "0", 2.0)]
    # The hung GPU's memory stays withheld: only the GPUs that answer have the server's memory.
    assert {(s.labels["server"], s.labels["gpu"]) for s in families["stallwatch_server_gpu_memory_used_bytes"].samples
            } == {("kimi", "0"), ("qwen", "2")}
