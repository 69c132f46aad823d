"""The GPU collector, from NVML's snapshot: whether NVML answered (`stallwatch_nvml_up`) and whether it is expected
to on this node (`stallwatch_nvml_expected`), so that a CPU-only node is told from a GPU node whose driver is broken;
nothing of either before NVML's first survey."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stallwatch.collectors.gpu import GpuCollector
from stallwatch.signals.devices import Devices
from stallwatch.signals.nvml import NO_GPU, UNAVAILABLE


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
