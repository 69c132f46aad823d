"""`XidEvents` over the fake pynvml of tests/support/fakes, its event threads running for real: an Xid of a GPU whose
every call hangs (Xid 119: its handle, index, UUID and memory calls too) is counted at once under that GPU's index and
UUID, and another GPU's Xid does not wait behind it; an exporter started while one GPU hangs registers the others at
once and the hung one once it answers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import pytest

from stallwatch.signals.nvml import Nvml
from stallwatch.signals.xid import XidEvents
from support.clock import Clock
from support.harness import gpus, poll
from support.nvml_inprocess import FakeNvml

PROMPTLY = 5.0  # seconds: an event is waited for one second at a time; the hang lasts 30
HANG = 30.0
UUIDS = [gpu["uuid"] for gpu in gpus(3)]


@pytest.fixture
def events(fake_nvml: FakeNvml) -> Iterator[Callable[[Nvml, Clock], XidEvents]]:
    """Start XidEvents over an Nvml; at the end, lift every hang and stop its threads."""
    started: list[XidEvents] = []

    def start(nvml: Nvml, clock: Clock) -> XidEvents:
        xid = XidEvents(nvml, clock=clock)
        xid.start()
        started.append(xid)
        return xid

    yield start
    fake_nvml.update(gpus=gpus(3))
    for xid in started:
        xid.stop()
    for thread in threading.enumerate():
        if thread.name.startswith("NVML events"):
            thread.join(PROMPTLY)


def _nvml(fake_nvml: FakeNvml, clock: Clock, hung: int | None = None) -> Nvml:
    """Three GPUs surveyed; each read once unless `hung`, whose calls all hang from the start (its reader runs on
    a thread of its own, blocked)."""
    scenario = gpus(3)
    if hung is not None:
        scenario[hung]["block"] = HANG
    fake_nvml.update(gpus=scenario)
    nvml = Nvml(1.0, 5.0, clock=clock)
    nvml.start()
    fake_nvml.run("NVML survey")
    for index in range(3):
        if index == hung:
            threading.Thread(target=fake_nvml.loops[f"NVML GPU {index}"], daemon=True).start()
        else:
            fake_nvml.run(f"NVML GPU {index}")
    return nvml


def _counts(xid: XidEvents) -> list[tuple[str, str, str, int]]:
    return [(c.gpu, c.uuid, c.xid, c.count) for c in xid.counts()]


def _hang(fake_nvml: FakeNvml, index: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call on GPU `index` blocks from now (`block`); the identity and memory calls made from now, by name."""
    spied = fake_nvml.spy(monkeypatch, ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetIndex", "nvmlDeviceGetUUID",
                                        "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo"))
    scenario = gpus(3)
    scenario[index]["block"] = HANG
    fake_nvml.update(gpus=scenario)
    return spied


def test_the_xid_of_a_hung_gpu_is_counted_at_once_under_its_name_and_others_do_not_wait(
        fake_nvml: FakeNvml, events: Callable[[Nvml, Clock], XidEvents], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stallwatch.signals.xid")
    clock = Clock(100.0)
    nvml = _nvml(fake_nvml, clock)
    xid = events(nvml, clock)
    # Xid 45 (cleanup) on each GPU first: every GPU is registered.
    cleanup = [{"id": f"45-{index}", "gpu": index, "data": 45} for index in range(3)]
    fake_nvml.update(events=cleanup)
    poll(lambda: len(xid.counts()) == 3, timeout=PROMPTLY, what="every GPU registered")
    spied = _hang(fake_nvml, 0, monkeypatch)
    fake_nvml.update(events=[*cleanup, {"id": 1, "gpu": 0, "type": "xid", "data": 119},
                             {"id": 2, "gpu": 1, "type": "xid", "data": 79}])
    poll(lambda: len(xid.counts()) == 5, timeout=PROMPTLY, what="both Xids counted")
    assert _counts(xid) == [("0", UUIDS[0], "119", 1), ("0", UUIDS[0], "45", 1), ("1", UUIDS[1], "45", 1),
                            ("1", UUIDS[1], "79", 1), ("2", UUIDS[2], "45", 1)]
    assert spied == []  # nothing asked of the hung GPU (nor of the other: the set says whose event it is)
    assert f"Xid 119 on GPU 0 {UUIDS[0]}" in caplog.text


def test_one_gpu_hanging_at_start_does_not_stop_the_others_registering(
        fake_nvml: FakeNvml, events: Callable[[Nvml, Clock], XidEvents], caplog: pytest.LogCaptureFixture) -> None:
    """Started while GPU 0 hangs (never read yet): GPUs 1 and 2 register at once and their Xids count; GPU 0 is said
    not registered once it has not answered for `gpu.timeout`, and registers once it answers."""
    caplog.set_level(logging.INFO, logger="stallwatch.signals.xid")
    clock = Clock(100.0)
    nvml = _nvml(fake_nvml, clock, hung=0)
    xid = events(nvml, clock)
    fake_nvml.update(events=[{"id": 1, "gpu": 2, "type": "xid", "data": 48}])
    poll(lambda: _counts(xid) == [("2", UUIDS[2], "48", 1)], timeout=PROMPTLY, what="GPU 2's Xid")
    assert "NVML events registered on GPU 0" not in caplog.text
    clock.now += 5.0
    poll(lambda: "GPU 0: NVML events not registered: it has not answered NVML for 5s" in caplog.text,
         timeout=PROMPTLY, what="GPU 0 said not registered")
    fake_nvml.update(gpus=gpus(3))  # it answers: its blocked reader reads it
    poll(lambda: "NVML events registered on GPU 0" in caplog.text, timeout=PROMPTLY, what="GPU 0 registered")
    fake_nvml.update(events=[{"id": 1, "gpu": 2, "type": "xid", "data": 48}, {"id": 2, "gpu": 0, "data": 119}])
    poll(lambda: len(xid.counts()) == 2, timeout=PROMPTLY, what="GPU 0's Xid")
    assert _counts(xid) == [("0", UUIDS[0], "119", 1), ("2", UUIDS[2], "48", 1)]
