"""What one look reports of the GPUs (`report.observe.gpu_section`): a GPU that does not answer NVML now (Xid 119:
its calls hang) is shown from its last answer, with the memory the server held on it then and the Xids it posted,
so that the verdict names its fault (audit 2026-12-02 #3)."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pynvml

from stallwatch.report.observe import gpu_section
from stallwatch.report.render import body_sections
from stallwatch.report.verdict import verdict
from stallwatch.signals.devices import Device, DeviceFailure, Devices
from stallwatch.signals.xid import XidCount
from support import reports
from support.looks import look, proc


def _device(index: int, pid: int) -> Device:
    return Device(str(index), f"GPU-{index}", "NVIDIA H100 80GB HBM3", 76e9, 80e9, 0.0, {pid: 75e9},
                  pci=f"0000:{0x18 + index:02x}:00")


def test_a_gpu_that_does_not_answer_is_shown_from_its_last_answer_with_its_fault() -> None:
    hung = DeviceFailure("0", "GPU-0", pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT), last=_device(0, 100))
    found = Devices(True, driver="550.54.15", devices=[_device(1, 999)], failed=[hung])
    runtime = SimpleNamespace(nvml=SimpleNamespace(read_devices=lambda: found), kernel_xids=None,
                              xid=SimpleNamespace(counts=lambda: [XidCount("0", "GPU-0", "119", 1, time.time() - 60)]))
    section = gpu_section(look(tree=[proc(100)]), runtime)  # type: ignore[arg-type]
    assert [(g.index, g.answering, g.server_memory_bytes, g.utilization) for g in section.gpus] == [
        ("0", False, 75e9, None), ("1", True, None, 0.0)]
    assert [x.xid for x in section.gpus[0].xids] == [119]
    assert section.error == "GPU 0 did not answer: NVMLError_Timeout"
    report = dataclasses.replace(reports.report({"phase": "serving", "quiet": 120, "probes": ["timeout"]}),
                                 gpu=section)
    assert "GPU 0 NVIDIA H100 80GB HBM3: DOES NOT ANSWER NVML; in its last answer the server held 75.0 GB" in \
        body_sections(report, evidence=False)[0]
    said = verdict(report, reports.MEMORY_THRESHOLD, reports.LOG_STALE)
    assert said.status == "failed"
    assert said.text.startswith("GPU 0 (GPU-0) reported Xid 119 x1 ") and "it does not answer NVML now" in said.text
