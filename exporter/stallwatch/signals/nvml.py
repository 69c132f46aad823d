"""NVML off the scrape path: its lifecycle (initialisation with backoff, re-initialisation when the driver goes),
one long-lived reader thread per GPU that keeps that GPU's last reading, and the snapshot (`Nvml.read_devices`)
that the GPU collector, the history and the reports share, which makes no NVML call.

A GPU whose firmware stops answering (Xid 119/120, a GSP RPC timeout) makes each call on it block for tens of
seconds (NVIDIA/open-gpu-kernel-modules#446; `nvidia-smi` and DCGM wedge the same way). Its reader blocks with it;
once a read has been in flight for `timeout` (or the last one finished longer than `timeout` plus two intervals
ago), the GPU reads as down and its values are withheld. The other GPUs, and the scrape, are unaffected. What a GPU
is (its handle, UUID, name, PCI address: `devices.Identity`) is read once, by its reader's first read, and kept: a GPU
that hangs later reads down under its own `gpu` and `uuid`, and nothing asks the hung device who it is.

A node with no NVIDIA GPU is not a GPU node whose driver is broken: when NVML's library is not found or the driver is
not loaded and the node shows no NVIDIA device (`shows_nvidia_gpu`), the snapshot says NVML is not expected there
(`Devices.expected`), unless the GPU collector was asked for by name, and that is logged once at info.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml

from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import LOOP_INTERVAL, positive_duration
from stallwatch.discovery.workload.rootfs import listdir
from stallwatch.loops import run_every
from stallwatch.signals.devices import (
    BusyIntegrator,
    Device,
    DeviceFailure,
    Devices,
    Identity,
    as_str,
    identify,
    pci_address,
    read_device,
)

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0
UNAVAILABLE = "NVML unavailable (no driver, or no access to it)"
NO_GPU = "no NVIDIA GPU on this node (no driver, no /dev/nvidiactl or /dev/nvidia<N>, no /proc/driver/nvidia)"
DEVICE_NODE = re.compile(r"nvidia(ctl|[0-9].*)")  # /dev/nvidiactl, /dev/nvidia0 ...; not nvidia-uvm, nvidia-caps


DRIVER_GPUS = ("driver", "nvidia", "gpus")  # under procfs: a folder per GPU, named by its PCI address
MAX_DRIVER_GPUS = 64
_DRIVER_UUID = re.compile(r"^GPU UUID:\s*(GPU-[0-9a-fA-F-]{1,64})\s*$", re.MULTILINE)
_DRIVER_PCI = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-7]")


def driver_uuids(procfs: str) -> dict[str, str]:
    """UUID by PCI address (as `pci_address` writes it) of every GPU the driver lists, from
    `/proc/driver/nvidia/gpus/<0000:18:00.0>/information` (`GPU UUID: GPU-...`): the driver's record, which asks no
    GPU anything, so a hung GPU is named without a call that would hang. Unreadable entries are left out."""
    folder = os.path.join(procfs, *DRIVER_GPUS)
    out: dict[str, str] = {}
    try:
        names = sorted(os.listdir(folder))[:MAX_DRIVER_GPUS]
    except OSError:
        return out
    for name in names:
        address = _DRIVER_PCI.fullmatch(name)
        try:
            with open(os.path.join(folder, name, "information"), encoding="ascii", errors="replace") as handle:
                found = _DRIVER_UUID.search(handle.read(4096))
        except OSError:
            continue
        if address is not None and found is not None:
            domain, bus, device = (int(part, 16) for part in address.groups())
            out[pci_address(domain, bus, device)] = found.group(1)
    return out


def shows_nvidia_gpu(rootfs: str, procfs: str) -> bool:
    """Whether the node shows an NVIDIA GPU or driver: a device node `/dev/nvidiactl` or `/dev/nvidia<N>` (a node
    path, read under `rootfs`), or the driver's `driver/nvidia` under `procfs`."""
    if any(DEVICE_NODE.fullmatch(name) for name in listdir(rootfs, "/dev")):
        return True
    return os.path.isdir(os.path.join(procfs, "driver", "nvidia"))


@dataclass(frozen=True)
class GpuSettings(CollectorSettings):
    """The `gpu:` section."""

    sample_interval: float = setting(LOOP_INTERVAL, 1.0)  # how often each GPU is read
    timeout: float = setting(positive_duration, 5.0)  # a read in flight this long: the GPU is down


@dataclass
class _Reading:
    """One GPU's reader: when its current read began (None: none in flight), and what the last one found."""

    started: float | None = None
    finished: float = float("-inf")
    device: Device | None = None
    answered: Device | None = None  # the last read that answered, kept while the GPU fails (for the reports)
    failure: DeviceFailure | None = None
    overdue: bool = False  # reported as not answering in time (logged once per episode)
    broken: str = ""  # the last read raised something that is not an NVMLError


@dataclass
class _Survey:
    """The node-wide calls (count, driver version), by the survey loop."""

    started: float | None = None
    count: int | None = None
    driver: str = ""
    error: str = UNAVAILABLE
    readers: set[int] = field(default_factory=set)
    surveyed: bool = False  # one survey has ended, whatever it found


class Nvml:
    """Owns NVML's lifecycle and the per-GPU readers. `available()` says whether calls may be made now."""

    def __init__(self, sample_interval: float, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, *, rootfs: str = "/", procfs: str = "/proc",
                 asked: bool = False) -> None:
        """`asked`: the GPU collector was asked for by name, so NVML is expected even where the node shows no GPU."""
        self.sample_interval, self.timeout = sample_interval, timeout
        self.rootfs, self.procfs, self.asked = rootfs, procfs, asked
        self._clock = clock
        self._lock = threading.Lock()  # never held across an NVML call but nvmlInit/Shutdown
        self._initialised = False
        self._next_attempt = 0.0
        self._backoff = 1.0
        self._last_error: str | None = None
        self._no_gpu = False  # the last initialisation failed on a node that shows no NVIDIA GPU
        self._busy: dict[str, BusyIntegrator] = {}  # by GPU UUID
        self._survey = _Survey()
        self._readings: dict[int, _Reading] = {}
        self._identities: dict[int, Identity] = {}  # by index: what each GPU is, from its first answer
        self._generation = 0  # successful initialisations so far: a handle is good for the one it came from
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
                wait, self._next_attempt = self._backoff, now + self._backoff
                self._backoff = min(self._backoff * 2, MAX_BACKOFF_SECONDS)
                message = f"{type(exc).__name__}: {exc}"
                no_gpu = self._shows_no_gpu(exc)
                # Once per distinct error: a node without a driver must not fill the log.
                if (message, no_gpu) == (self._last_error, self._no_gpu):
                    log.debug("NVML unavailable (%s); retrying in %.0fs", message, wait)
                elif no_gpu:
                    log.info("NVML unavailable (%s) and no NVIDIA GPU on this node (no /dev/nvidiactl or "
                             "/dev/nvidia<N> under %s, no %s/driver/nvidia): stallwatch_nvml_expected 0, no alert; "
                             "--no-collector.gpu or gpu: {enabled: false} turns the GPU collector off",
                             message, self.rootfs, self.procfs)
                else:
                    log.warning("NVML unavailable (%s); retrying in %.0fs", message, wait)
                self._last_error, self._no_gpu = message, no_gpu
                return False
            self._initialised = True
            self._generation += 1
            self._backoff = 1.0
            self._last_error, self._no_gpu = None, False
            log.info("NVML initialised")
            return True

    def _shows_no_gpu(self, exc: pynvml.NVMLError) -> bool:
        """Whether an initialisation that failed with `exc` is on a node with no NVIDIA GPU (never when asked for)."""
        missing = isinstance(exc, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded))
        return missing and not self.asked and not shows_nvidia_gpu(self.rootfs, self.procfs)

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
                self._survey.count = None
                self._survey.error = f"NVML: {exc}"

    # -- the snapshot --------------------------------------------------------------------------------------
    def read_devices(self) -> Devices:
        """The last reading of every device, from memory: a device that did not answer, or whose read has
        been in flight for `timeout`, is listed in `failed`, never with stale values."""
        now = self._clock()
        with self._lock:
            survey = self._survey
            if survey.started is not None and now - survey.started >= self.timeout:
                return Devices(False, f"NVML did not answer within {self.timeout:g}s")
            if not survey.surveyed:
                return Devices(False, "NVML not read yet", known=False)
            if self._no_gpu:
                return Devices(False, NO_GPU, expected=False)
            if not self._initialised or survey.count is None:
                return Devices(False, survey.error)
            out = Devices(True, driver=survey.driver)
            for index in range(survey.count):
                reading = self._readings.get(index)
                if reading is None:
                    continue  # its reader has not begun: a GPU found a moment ago
                late = reading.started is not None and now - reading.started >= self.timeout
                stale = reading.device is not None and now - reading.finished > self.timeout + 2 * self.sample_interval
                if reading.broken:
                    out.broken.append(f"GPU {index}: {reading.broken}")
                if late or stale:
                    out.failed.append(dataclasses.replace(self._overdue(index, reading), last=reading.answered))
                elif reading.failure is not None:  # its UUID as known now: the others' answers may name it
                    out.failed.append(dataclasses.replace(reading.failure, uuid=reading.failure.uuid
                                                          or self._uuid(index), last=reading.answered))
                elif reading.device is not None:
                    out.devices.append(reading.device)
            return out

    def _overdue(self, index: int, reading: _Reading) -> DeviceFailure:
        if not reading.overdue:
            reading.overdue = True
            log.warning("GPU %d has not answered NVML for %gs; reported down until it does", index, self.timeout)
        return DeviceFailure(str(index), self._uuid(index), pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT))

    def _uuid(self, index: int) -> str:
        """GPU `index`'s UUID as it last said it; for one that never answered, the driver's record of it where that
        can only be this GPU (`_unanswered_uuid`), else ""; under the lock."""
        identity = self._identities.get(index)
        return identity.uuid if identity is not None else self._unanswered_uuid(index)

    def _unanswered_uuid(self, index: int) -> str:
        """The UUID of GPU `index`, which never answered (it hung before the exporter's first reading), from the
        driver's own list of its GPUs (`driver_uuids`): only when it is the one GPU of the survey's count that never
        answered and the list has exactly one GPU whose PCI address no answer gave. NVML's index order is not the
        PCI order for certain, so with two such GPUs neither is named."""
        count = self._survey.count or 0
        if [i for i in range(count) if i not in self._identities] != [index]:
            return ""
        known = {identity.pci for identity in self._identities.values()}
        listed = driver_uuids(self.procfs)
        left = [uuid for pci, uuid in listed.items() if pci not in known]
        return left[0] if len(listed) == count and len(left) == 1 else ""

    def identity(self, index: int) -> Identity | None:
        """What GPU `index` is, from its last answer (None: it never answered): no NVML call."""
        with self._lock:
            return self._identities.get(index)

    def indices(self) -> list[int]:
        """The GPUs the last survey counted (none while NVML is down)."""
        with self._lock:
            return list(range(self._survey.count or 0)) if self._initialised else []

    def answering(self, index: int) -> Identity | None:
        """GPU `index`'s identity when a call on it may be made now without expecting it to hang: its handle is of
        the current initialisation, its last read answered, and no read of it is in flight past `timeout`."""
        now = self._clock()
        with self._lock:
            identity, reading = self._identities.get(index), self._readings.get(index)
            if identity is None or reading is None or not self._initialised or identity.generation != self._generation:
                return None
            if reading.device is None or reading.failure is not None or reading.overdue:
                return None
            if reading.started is not None and now - reading.started >= self.timeout:
                return None
            return identity

    def busy_seconds(self, uuid: str) -> float | None:
        with self._lock:
            integrator = self._busy.get(uuid)
            return integrator.busy_seconds if integrator else None

    def settle(self, wait: float) -> None:
        """Wait, at most `wait` seconds, until NVML was found missing or every GPU was read once or is late (for
        a one-shot report, which starts the readers just before)."""
        deadline = self._clock() + wait
        while self._clock() < deadline and not self._settled():
            time.sleep(0.05)

    def _settled(self) -> bool:
        with self._lock:
            if not self._initialised and self._last_error is not None:
                return True
            count, now = self._survey.count, self._clock()
            if count is None:
                return False
            for index in range(count):
                reading = self._readings.get(index)
                if reading is None or (reading.device is None and reading.failure is None and not (
                        reading.started is not None and now - reading.started >= self.timeout)):
                    return False
            return True

    # -- the readers -----------------------------------------------------------------------------------------
    def _survey_once(self) -> None:
        """Count the GPUs and start a reader for each new index (the calls may block: never in a scrape)."""
        try:
            self._survey_gpus()
        finally:
            with self._lock:
                self._survey.surveyed = True

    def _survey_gpus(self) -> None:
        if not self.available():
            with self._lock:
                self._survey.count, self._survey.error = None, UNAVAILABLE
            return
        with self._lock:
            self._survey.started = self._clock()
        try:
            count = pynvml.nvmlDeviceGetCount()
            driver = as_str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as exc:
            self.lost(exc)
            with self._lock:
                self._survey.count, self._survey.error = None, f"NVML: {exc}"
            return
        finally:
            with self._lock:
                self._survey.started = None
        with self._lock:
            self._survey.count, self._survey.driver = count, driver
            new = [index for index in range(count) if index not in self._survey.readers]
            self._survey.readers.update(new)
            for index in new:
                self._readings.setdefault(index, _Reading())
        for index in new:
            run_every(self.sample_interval, lambda i=index: self._read(i), f"NVML GPU {index}", self._stop)

    def _read(self, index: int) -> None:
        if not self.available():
            return
        with self._lock:
            reading = self._readings[index]
            reading.started = self._clock()
            identity, generation = self._identities.get(index), self._generation
        try:
            if identity is None or identity.generation != generation:
                identity = self._identify(index, generation)
            device, failure = read_device(identity, self._integrator), None
        except pynvml.NVMLError as exc:
            if reading.failure is None or type(reading.failure.error) is not type(exc):  # once per episode
                level = logging.WARNING if isinstance(exc, pynvml.NVMLError_GpuIsLost) else logging.DEBUG
                log.log(level, "GPU %d did not answer: %s: %s", index, type(exc).__name__, exc)
            with self._lock:
                uuid = self._uuid(index)
            device, failure = None, DeviceFailure(str(index), uuid, exc)
            self.lost(exc)
        except Exception as exc:  # a bug, or a library that answers nonsense: the collector fails, and says why
            with self._lock:
                reading.started, reading.finished = None, self._clock()
                reading.device, reading.broken = None, f"{type(exc).__name__}: {exc}"
            raise
        with self._lock:
            if reading.overdue:
                log.info("GPU %d answers NVML again", index)
            reading.started, reading.finished, reading.overdue = None, self._clock(), False
            reading.device, reading.failure, reading.broken = device, failure, ""
            reading.answered = device or reading.answered

    def _identify(self, index: int, generation: int) -> Identity:
        """Ask GPU `index` who it is (once per initialisation of NVML) and keep the answer."""
        identity = identify(index, generation)
        with self._lock:
            known = self._identities.get(index)
            if known is not None and known.uuid != identity.uuid:
                log.warning("GPU %d is %s now, was %s", index, identity.uuid, known.uuid)
            self._identities[index] = identity
        return identity

    def _integrator(self, uuid: str) -> BusyIntegrator:
        with self._lock:
            return self._busy.setdefault(uuid, BusyIntegrator())

    def start(self) -> None:
        run_every(self.sample_interval, self._survey_once, "NVML survey", self._stop)

    def stop(self) -> None:
        self._stop.set()
