"""`Nvml`, in-process on a test clock, over the fake pynvml of tests/support/fakes (nvidia-ml-py's own NVMLError
classes and constants, device calls read from a scenario file): the snapshot, which makes no NVML call; the backoff of
initialisation while NVML is missing; a node that shows no NVIDIA GPU, told from a GPU node whose driver is broken;
a lost GPU and a lost driver; a reader whose read is overdue.

The survey and the readers are the loops `Nvml.start` hands to `run_every`: here they are kept instead of started, and
each test runs them by name, so every read happens when the test says."""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from stallwatch.signals.devices import Devices
from stallwatch.signals.nvml import MAX_BACKOFF_SECONDS, NO_GPU, UNAVAILABLE, Nvml
from support.clock import Clock
from support.harness import gpus
from support.nvml_inprocess import FakeNvml

WAIT = 5.0  # the most a test waits for a reader it runs in a thread


class Node:
    """A node's root and procfs under tmp_path, with none of NVIDIA's device nodes or driver files until `show`."""

    def __init__(self, base: Path) -> None:
        self.rootfs, self.procfs = base / "host", base / "host" / "proc"
        (self.rootfs / "dev").mkdir(parents=True)
        self.procfs.mkdir()
        for name in ("null", "zero", "tty0", "nvme0", "nvme0n1"):  # what every node has, and near-misses
            (self.rootfs / "dev" / name).touch()

    def show(self, path: str) -> None:
        """Make a node path: `dev/nvidia0` a file under the root, `proc/driver/nvidia` a folder under procfs."""
        target = self.rootfs / path
        if path.startswith("proc/"):
            target.mkdir(parents=True)
        else:
            target.touch()

    def nvml(self, clock: Clock, timeout: float = 5.0, sample_interval: float = 1.0, asked: bool = False) -> Nvml:
        return Nvml(sample_interval, timeout, clock=clock, rootfs=str(self.rootfs), procfs=str(self.procfs),
                    asked=asked)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def gpu_node(node: Node) -> Node:
    """A GPU node: its device nodes and the driver's procfs folder are there, whatever NVML says."""
    for path in ("dev/nvidiactl", "dev/nvidia0", "dev/nvidia1", "proc/driver/nvidia"):
        node.show(path)
    return node


def _started(fake_nvml: FakeNvml, clock: Clock, timeout: float = 5.0, sample_interval: float = 1.0,
             node: Node | None = None) -> Nvml:
    """An Nvml whose survey has run once (its readers are known, none has read yet)."""
    nvml = node.nvml(clock, timeout, sample_interval) if node else Nvml(sample_interval, timeout, clock=clock)
    nvml.start()
    fake_nvml.run("NVML survey")
    return nvml


def _listed(found: Devices) -> list[str]:
    return [d.index for d in found.devices]


def _failed(found: Devices) -> list[tuple[str, str, str]]:
    return [(f.index, f.uuid, type(f.error).__name__) for f in found.failed]


def test_the_snapshot_knows_nothing_before_the_first_survey(fake_nvml: FakeNvml) -> None:
    """Before NVML was ever surveyed the snapshot is down and unknown, so no alert reads it as a failure."""
    found = Nvml(1.0, clock=Clock()).read_devices()
    assert (found.up, found.known, found.error) == (False, False, "NVML not read yet")


def test_each_gpu_is_listed_once_its_reader_read_it(fake_nvml: FakeNvml) -> None:
    """The survey starts one reader per GPU; the snapshot lists each GPU with what its reader last read."""
    nvml = _started(fake_nvml, Clock())
    assert sorted(fake_nvml.loops) == ["NVML GPU 0", "NVML GPU 1", "NVML survey"]
    found = nvml.read_devices()
    assert (found.up, found.driver, found.devices, found.failed) == (True, "550.54.15", [], [])
    fake_nvml.run("NVML GPU 1")
    assert _listed(nvml.read_devices()) == ["1"]
    fake_nvml.run("NVML GPU 0")
    found = nvml.read_devices()
    assert _listed(found) == ["0", "1"]
    device = found.devices[0]
    assert (device.uuid, device.name, device.used, device.total, device.utilization, device.processes) == (
        gpus(1)[0]["uuid"], "NVIDIA H100 80GB HBM3", 40e9, 80 * 2**30, 0.5, {1234: 40e9})


def test_the_snapshot_makes_no_nvml_call(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the snapshot (what a scrape does) calls nothing of NVML, so a hung driver cannot hold a scrape."""
    nvml = _started(fake_nvml, Clock())
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    before = nvml.read_devices()

    def called(*args: object, **kwargs: object) -> None:
        raise AssertionError("an NVML call from the snapshot")

    for name in dir(fake_nvml.fake):
        if name.startswith("nvml") and callable(getattr(fake_nvml.fake, name)):
            monkeypatch.setattr(fake_nvml.fake, name, called)
    assert nvml.read_devices() == before


def test_a_survey_without_nvml_reads_as_unavailable(fake_nvml: FakeNvml, gpu_node: Node) -> None:
    """With no driver or library on a GPU node the snapshot is down (known), saying NVML is unavailable, NVML is
    expected there, and no reader starts."""
    fake_nvml.update(missing=True)
    nvml = _started(fake_nvml, Clock(), node=gpu_node)
    found = nvml.read_devices()
    assert (found.up, found.known, found.expected, found.error) == (False, True, True, UNAVAILABLE)
    assert sorted(fake_nvml.loops) == ["NVML survey"]


def _failing_init(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, error: str) -> None:
    """nvmlInit raises nvidia-ml-py's own class for NVML_ERROR_<error>, as the real library does."""
    code = getattr(fake_nvml.fake, f"NVML_ERROR_{error}")

    def init() -> None:
        raise fake_nvml.fake.NVMLError(code)

    monkeypatch.setattr(fake_nvml.fake, "nvmlInit", init)


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


@pytest.mark.parametrize(("error", "raised"), [("LIBRARY_NOT_FOUND", "NVMLError_LibraryNotFound"),
                                               ("DRIVER_NOT_LOADED", "NVMLError_DriverNotLoaded")])
def test_a_node_that_shows_no_nvidia_gpu_does_not_expect_nvml(
        fake_nvml: FakeNvml, node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        error: str, raised: str) -> None:
    """No driver library or no driver, and no /dev/nvidiactl, /dev/nvidia<N> or /proc/driver/nvidia under the
    configured roots: a CPU-only node. The snapshot is down but not expected, says there is no GPU, and that is
    logged once at info with how to turn the collector off; the backoff's retries log nothing above debug."""
    caplog.set_level(logging.DEBUG, logger="stallwatch.signals.nvml")
    _failing_init(fake_nvml, monkeypatch, error)
    clock = Clock(0.0)
    nvml = _started(fake_nvml, clock, node=node)
    for _ in range(4):
        found = nvml.read_devices()
        assert (found.up, found.known, found.expected, found.error) == (False, True, False, NO_GPU)
        clock.now += MAX_BACKOFF_SECONDS
        fake_nvml.run("NVML survey")
    assert _said(caplog, logging.WARNING) == []
    [info] = _said(caplog, logging.INFO)
    assert raised in info and "no NVIDIA GPU on this node" in info
    assert "--no-collector.gpu" in info and "gpu: {enabled: false}" in info
    assert len(_said(caplog, logging.DEBUG)) == 4  # the retries


@pytest.mark.parametrize("shown", ["dev/nvidiactl", "dev/nvidia0", "dev/nvidia7", "proc/driver/nvidia"])
@pytest.mark.parametrize("error", ["LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED"])
def test_a_gpu_node_whose_driver_is_broken_expects_nvml(
        fake_nvml: FakeNvml, node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        shown: str, error: str) -> None:
    """The same NVML errors on a node that shows any one NVIDIA device node or the driver's procfs folder: a GPU
    node whose driver is broken. NVML is expected (so StallwatchNvmlDown fires) and the failure is a warning."""
    caplog.set_level(logging.INFO, logger="stallwatch.signals.nvml")
    _failing_init(fake_nvml, monkeypatch, error)
    node.show(shown)
    found = _started(fake_nvml, Clock(), node=node).read_devices()
    assert (found.up, found.known, found.expected, found.error) == (False, True, True, UNAVAILABLE)
    assert len(_said(caplog, logging.WARNING)) == 1 and _said(caplog, logging.INFO) == []


def test_other_nvml_failures_on_a_node_without_devices_still_expect_nvml(
        fake_nvml: FakeNvml, node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a missing library or driver says "no GPU": NVML that is there but refuses (no permission, a library that
    does not match the kernel module) is broken whatever /dev shows."""
    for error in ("NO_PERMISSION", "LIB_RM_VERSION_MISMATCH", "UNKNOWN"):
        _failing_init(fake_nvml, monkeypatch, error)
        found = _started(fake_nvml, Clock(), node=node).read_devices()
        assert (found.up, found.expected, found.error) == (False, True, UNAVAILABLE), error


def test_a_gpu_collector_asked_for_by_name_expects_nvml_on_any_node(
        fake_nvml: FakeNvml, node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """`--collector.gpu` or `gpu: {enabled: true}` says the node has GPUs: no NVML there is a failure, warned."""
    caplog.set_level(logging.INFO, logger="stallwatch.signals.nvml")
    fake_nvml.update(missing=True)
    nvml = node.nvml(Clock(), asked=True)
    nvml.start()
    fake_nvml.run("NVML survey")
    found = nvml.read_devices()
    assert (found.up, found.expected, found.error) == (False, True, UNAVAILABLE)
    assert len(_said(caplog, logging.WARNING)) == 1 and _said(caplog, logging.INFO) == []


def test_a_node_whose_driver_comes_is_expected_from_the_next_attempt(
        fake_nvml: FakeNvml, node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """The node is looked at again at each initialisation attempt: device nodes that appear (the driver installed,
    NVML still failing) make NVML expected and warned; once NVML answers, it is up and expected."""
    caplog.set_level(logging.INFO, logger="stallwatch.signals.nvml")
    fake_nvml.update(missing=True)
    clock = Clock(0.0)
    nvml = _started(fake_nvml, clock, node=node)
    assert nvml.read_devices().expected is False
    node.show("dev/nvidiactl")
    fake_nvml.run("NVML survey")  # within the backoff: no attempt, nothing looked at
    assert nvml.read_devices().expected is False
    clock.now += 1.0
    fake_nvml.run("NVML survey")
    found = nvml.read_devices()
    assert (found.up, found.expected, found.error) == (False, True, UNAVAILABLE)
    assert len(_said(caplog, logging.INFO)) == 1 and len(_said(caplog, logging.WARNING)) == 1
    fake_nvml.update(missing=False)
    clock.now += 2.0
    fake_nvml.run("NVML survey")
    found = nvml.read_devices()
    assert (found.up, found.expected) == (True, True)


def test_the_node_is_read_under_its_root_not_the_exporters_own(fake_nvml: FakeNvml, node: Node) -> None:
    """In a container with the node's root at /host, a node path that is a link is followed inside that root: a
    `/dev` that links to the absolute `/devices` finds the node's devices there, not the exporter's own."""
    fake_nvml.update(missing=True)
    dev = node.rootfs / "dev"
    dev.rename(node.rootfs / "devices")
    (node.rootfs / "devices" / "nvidia0").touch()
    dev.symlink_to("/devices")
    assert _started(fake_nvml, Clock(), node=node).read_devices().expected is True


def test_initialisation_is_retried_with_a_backoff_that_doubles_to_its_cap(
        fake_nvml: FakeNvml, gpu_node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """While NVML is missing, nvmlInit is tried 1, 2, 4 ... s apart, never more than MAX_BACKOFF_SECONDS, and the
    failure is logged as a warning once."""
    caplog.set_level(logging.DEBUG, logger="stallwatch.signals.nvml")
    fake_nvml.update(missing=True)
    attempts: list[float] = []
    clock = Clock(1000.0)
    real_init = fake_nvml.fake.nvmlInit

    def init() -> None:
        attempts.append(clock.now)
        real_init()

    monkeypatch.setattr(fake_nvml.fake, "nvmlInit", init)
    nvml = gpu_node.nvml(clock)
    gaps = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, MAX_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS]
    assert nvml.available() is False
    for gap in gaps:
        clock.now += gap - 0.01
        assert nvml.available() is False
        clock.now += 0.01
        assert nvml.available() is False
    assert [b - a for a, b in itertools.pairwise(attempts)] == pytest.approx(gaps)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "LibraryNotFound" in warnings[0].getMessage()


def test_a_successful_initialisation_resets_the_backoff(fake_nvml: FakeNvml) -> None:
    """Once NVML initialised, a later loss of it is retried after 1 s again, not after the last long wait."""
    clock = Clock(0.0)
    fake_nvml.update(missing=True)
    nvml = Nvml(1.0, clock=clock)
    for gap in (0.0, 1.0, 2.0, 4.0):  # four failures: the next wait would be 16 s
        clock.now += gap
        assert nvml.available() is False
    clock.now += 8.0
    fake_nvml.update(missing=False)
    assert nvml.available() is True
    nvml.lost(fake_nvml.fake.NVMLError(fake_nvml.fake.NVML_ERROR_DRIVER_NOT_LOADED))
    fake_nvml.update(missing=True)
    assert nvml.available() is False
    clock.now += 1.0
    fake_nvml.update(missing=False)
    assert nvml.available() is True


def test_a_lost_gpu_is_failed_while_the_others_stay(fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU that fell off the bus is listed as failed (GpuIsLost, warned once), never with its last values; the
    other GPUs stay listed; once it answers again it is listed again."""
    caplog.set_level(logging.DEBUG, logger="stallwatch.signals.nvml")
    nvml = _started(fake_nvml, Clock())
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    lost = gpus(2, used=40e9, util=50)
    lost[1]["lost"] = True
    fake_nvml.update(gpus=lost)
    fake_nvml.run("NVML GPU 1")
    fake_nvml.run("NVML GPU 1")
    found = nvml.read_devices()
    assert (found.up, _listed(found)) == (True, ["0"])
    assert [(f.index, type(f.error)) for f in found.failed] == [("1", fake_nvml.fake.NVMLError_GpuIsLost)]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == ["GPU 1 did not answer: NVMLError_GpuIsLost: GPU is lost"]
    fake_nvml.update(gpus=gpus(2))
    fake_nvml.run("NVML GPU 1")
    assert (_listed(nvml.read_devices()), nvml.read_devices().failed) == (["0", "1"], [])


def test_a_gpu_no_longer_counted_is_no_longer_listed(fake_nvml: FakeNvml) -> None:
    """When the survey counts fewer GPUs, the snapshot lists only those counted, not the last reading of the rest."""
    nvml = _started(fake_nvml, Clock())
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    fake_nvml.update(gpus=gpus(1))
    fake_nvml.run("NVML survey")
    found = nvml.read_devices()
    assert (_listed(found), found.failed) == (["0"], [])


def test_a_lost_driver_makes_nvml_down_until_it_is_initialised_again(fake_nvml: FakeNvml) -> None:
    """A call that says NVML is uninitialised (the library unloaded under us) makes the snapshot down with NVML's
    word; the next survey initialises NVML again and lists the GPUs."""
    nvml = _started(fake_nvml, Clock())
    fake_nvml.run("NVML GPU 0")
    fake_nvml.fake.nvmlShutdown()  # as if the driver went away: every call now fails Uninitialized
    fake_nvml.run("NVML GPU 0")
    found = nvml.read_devices()
    assert (found.up, found.error, found.devices) == (False, "NVML: Uninitialized", [])
    fake_nvml.run("NVML survey")
    fake_nvml.run("NVML GPU 0")
    assert (nvml.read_devices().up, _listed(nvml.read_devices())) == (True, ["0"])


def test_a_reader_that_stopped_reading_is_overdue(fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture) -> None:
    """A GPU whose last read ended more than `timeout` plus two intervals ago is failed (Timeout, with its UUID),
    warned once; when its reader reads again it is listed again, said once."""
    caplog.set_level(logging.INFO, logger="stallwatch.signals.nvml")
    clock = Clock(100.0)
    nvml = _started(fake_nvml, clock, timeout=5.0, sample_interval=1.0)
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    clock.now = 107.0  # 7 s since the last read ended: not yet more than 5 + 2 x 1
    assert _listed(nvml.read_devices()) == ["0", "1"]
    fake_nvml.run("NVML GPU 1")
    clock.now = 107.5
    for _ in range(2):
        found = nvml.read_devices()
        assert (_listed(found), _failed(found)) == (["1"], [("0", gpus(1)[0]["uuid"], "NVMLError_Timeout")])
    fake_nvml.run("NVML GPU 0")
    assert _listed(nvml.read_devices()) == ["0", "1"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GPU 0")]
    assert said == ["GPU 0 has not answered NVML for 5s; reported down until it does", "GPU 0 answers NVML again"]


def test_a_read_in_flight_for_the_timeout_is_overdue(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU whose read has hung for `timeout` is failed, never listed with its last values; the other GPU and the
    snapshot are not held by it; when the read ends the GPU is listed again."""
    clock = Clock(100.0)
    nvml = _started(fake_nvml, clock, timeout=5.0)
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    entered, answer = threading.Event(), threading.Event()
    memory = fake_nvml.fake.nvmlDeviceGetMemoryInfo

    def hanging(handle: Any, *args: Any, **kwargs: Any) -> Any:
        if handle.index == 0:
            entered.set()
            answer.wait(WAIT)
        return memory(handle, *args, **kwargs)

    monkeypatch.setattr(fake_nvml.fake, "nvmlDeviceGetMemoryInfo", hanging)
    reader = threading.Thread(target=fake_nvml.loops["NVML GPU 0"], daemon=True)
    reader.start()
    try:
        assert entered.wait(WAIT)
        clock.now = 104.9
        assert _listed(nvml.read_devices()) == ["0", "1"]  # in flight, not yet late: its last reading stands
        clock.now = 105.0
        found = nvml.read_devices()
        assert (_listed(found), _failed(found)) == (["1"], [("0", gpus(1)[0]["uuid"], "NVMLError_Timeout")])
    finally:
        answer.set()
        reader.join(WAIT)
    assert not reader.is_alive()
    assert _listed(nvml.read_devices()) == ["0", "1"]


def test_a_survey_in_flight_for_the_timeout_makes_nvml_down(fake_nvml: FakeNvml,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A node-wide call (the GPU count) that hangs for `timeout` makes the whole snapshot down, saying so."""
    clock = Clock(100.0)
    nvml = _started(fake_nvml, clock, timeout=5.0)
    entered, answer = threading.Event(), threading.Event()
    count = fake_nvml.fake.nvmlDeviceGetCount

    def hanging() -> int:
        entered.set()
        answer.wait(WAIT)
        return count()

    monkeypatch.setattr(fake_nvml.fake, "nvmlDeviceGetCount", hanging)
    survey = threading.Thread(target=fake_nvml.loops["NVML survey"], daemon=True)
    survey.start()
    try:
        assert entered.wait(WAIT)
        clock.now = 104.9
        assert nvml.read_devices().up is True
        clock.now = 105.0
        found = nvml.read_devices()
        assert (found.up, found.error) == (False, "NVML did not answer within 5s")
    finally:
        answer.set()
        survey.join(WAIT)
    assert nvml.read_devices().up is True


def test_a_reader_that_raises_other_than_nvml_is_broken(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading that fails with something that is not an NVMLError (a bug, a library answering nonsense) is said in
    `broken`, and the GPU's last values are not listed as if fresh."""
    nvml = _started(fake_nvml, Clock())
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")

    def nonsense(handle: Any, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("nonsense")

    monkeypatch.setattr(fake_nvml.fake, "nvmlDeviceGetMemoryInfo", nonsense)  # read each time (the name once)
    with pytest.raises(ValueError):
        fake_nvml.run("NVML GPU 0")  # run_every logs it and goes on
    found = nvml.read_devices()
    assert (found.up, _listed(found), found.broken) == (True, ["1"], ["GPU 0: ValueError: nonsense"])


IDENTITY_CALLS = ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetIndex", "nvmlDeviceGetName",
                  "nvmlDeviceGetPciInfo")


def test_a_gpu_whose_every_call_hangs_keeps_its_name(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Xid 119: every call on GPU 0 (its handle, index, UUID and memory as much as its utilization) blocks, then fails
    with Timeout. It reads down under the UUID it said before, while in flight and after its calls time out, and no
    call asks it who it is again; the other GPU reads on. Once it answers it is listed again, with the same name."""
    clock = Clock(100.0)
    nvml = _started(fake_nvml, clock, timeout=5.0)
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    asked = fake_nvml.spy(monkeypatch, IDENTITY_CALLS)
    hung = gpus(2, used=40e9, util=50, processes=[{"pid": 1234, "used": 40e9}])
    hung[0]["block"] = 0.3  # each call: 0.3 s, then NVML_ERROR_TIMEOUT
    fake_nvml.update(gpus=hung)
    uuid = gpus(1)[0]["uuid"]
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    found = nvml.read_devices()
    assert (_listed(found), _failed(found)) == (["1"], [("0", uuid, "NVMLError_Timeout")])
    assert nvml.identity(0) is not None and nvml.identity(0).uuid == uuid
    last = found.failed[0].last  # its last answer, for the reports (who held memory on it), never exported as now
    assert last is not None and (last.uuid, last.processes) == (uuid, {1234: 40e9})
    assert nvml.answering(0) is None and nvml.answering(1) is not None
    clock.now = 120.0  # and long after its last answer: overdue, still under its own UUID
    assert _failed(nvml.read_devices()) == [("0", uuid, "NVMLError_Timeout"), ("1", gpus(2)[1]["uuid"],
                                                                               "NVMLError_Timeout")]
    assert asked == []
    fake_nvml.update(gpus=gpus(2, used=40e9, util=50))
    fake_nvml.run("NVML GPU 0")
    fake_nvml.run("NVML GPU 1")
    found = nvml.read_devices()
    assert ([(d.index, d.uuid) for d in found.devices], found.failed) == ([("0", uuid), ("1", gpus(2)[1]["uuid"])], [])
    assert asked == []


def _driver_lists(node: Node, *entries: tuple[str, str]) -> None:
    """The driver's procfs folder of each GPU (`/proc/driver/nvidia/gpus/<PCI>/information`), as the 550 driver
    writes it."""
    for pci, uuid in entries:
        folder = node.procfs / "driver" / "nvidia" / "gpus" / pci
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.74.00.01\n"
            f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nBus Location: \t {pci}\nDevice Minor: \t 0\n"
            "GPU Excluded:\t No\n")


def test_a_gpu_hung_before_its_first_answer_is_named_by_the_drivers_list(fake_nvml: FakeNvml, node: Node) -> None:
    """The exporter starts while GPU 1 hangs (every call on it blocks, then Timeout): it never said who it is. The
    driver's procfs list names three GPUs, and GPU 0 and 2 answered with two of their PCI addresses: the third is
    GPU 1's, so it reads down under its own UUID. A second GPU that never answered leaves both unnamed (NVML's index
    order is not the PCI order for certain)."""
    devices = gpus(3, used=40e9, util=50)
    devices[1]["block"] = 0.3
    fake_nvml.update(gpus=devices)
    _driver_lists(node, *((f"0000:{0x18 + i:02x}:00.0", devices[i]["uuid"]) for i in range(3)))
    nvml = _started(fake_nvml, Clock(100.0), node=node)
    for index in range(3):
        fake_nvml.run(f"NVML GPU {index}")
    assert _failed(nvml.read_devices()) == [("1", devices[1]["uuid"], "NVMLError_Timeout")]
    assert nvml.identity(1) is None  # named for its failure, never taken for an answer

    devices[2]["block"] = 0.3
    fake_nvml.update(gpus=devices)
    both = _started(fake_nvml, Clock(100.0), node=node)
    for index in range(3):
        fake_nvml.run(f"NVML GPU {index}")
    assert _failed(both.read_devices()) == [("1", "", "NVMLError_Timeout"), ("2", "", "NVMLError_Timeout")]


def test_a_gpu_is_asked_who_it_is_again_after_nvml_is_initialised_again(fake_nvml: FakeNvml) -> None:
    """A handle is good for the initialisation it came from: after NVML is lost and initialised again, each GPU's
    reader asks for a fresh handle, and a GPU not yet read since is not `answering` (no call may be made on it)."""
    nvml = _started(fake_nvml, Clock())
    fake_nvml.run("NVML GPU 0")
    first = nvml.identity(0)
    assert first is not None and nvml.answering(0) == first
    fake_nvml.fake.nvmlShutdown()
    fake_nvml.run("NVML GPU 0")  # Uninitialized: NVML is lost
    fake_nvml.run("NVML survey")  # initialised again
    assert nvml.answering(0) is None
    fake_nvml.run("NVML GPU 0")
    again = nvml.answering(0)
    assert again is not None and again.generation == first.generation + 1 and again.uuid == first.uuid
