"""Xid errors from NVML's event API, without DCGM or the kernel log: one long-lived thread registers the supported
subset of `nvmlEventTypeXidCriticalError`, `nvmlEventTypeGpuUnavailableError` and `nvmlEventTypeGpuRecoveryAction`
on every GPU (`nvmlDeviceRegisterEvents`) and waits on them (`nvmlEventSetWait_v2`, one second at a time, so that
it stops promptly); on an error other than the wait's timeout it frees the set and builds a new one, with backoff.

NVML delivers only events that occur after registration ("All events that occurred before this call are not
recorded", nvml.h) and their data carries no time (the `_v2` struct): the counts start at the exporter's start and
the time of each is when it was received. A GPU that falls off the bus posts `GpuUnavailableError`; it is counted as
Xid 79, the Xid the driver logs for it (NVIDIA/open-gpu-kernel-modules `src/nvidia/arch/nvalloc/unix/src/osinit.c`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from stallwatch.signals.devices import as_str
from stallwatch.signals.nvml import Nvml

log = logging.getLogger(__name__)

WAIT_MS = 1000
MAX_BACKOFF_SECONDS = 60.0
WANTED = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuUnavailableError
          | pynvml.nvmlEventTypeGpuRecoveryAction)
FALLEN_OFF_THE_BUS = 79


@dataclass(frozen=True)
class XidClass:
    kind: str  # fault: the GPU needs a reset or a reboot (pages) | application: a rank faulted (tickets)
    meaning: str  # what it means and what to do, as the alerts and the reports say it


# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, resolution column): the Xids the rules alert on, with
# the same sets and windows as InferenceServerGpuFault and InferenceServerGpuApplicationFault
# (tests/shipped/test_rules.py holds them equal). Any other Xid (45 cleanup, 63 and 92 information, 94 contained ECC) is
# counted and shown, never alerted on.
XIDS = {
    13: XidClass("application", "a graphics engine exception"),
    31: XidClass("application", "a memory page fault"),
    43: XidClass("application", "the GPU stopped a channel"),
    48: XidClass("fault", "an uncorrectable ECC error: reset the GPU"),
    62: XidClass("fault", "the GPU stopped processing: reset it"),
    64: XidClass("fault", "a row remap failed: reset the GPU"),
    74: XidClass("fault", "an NVLink error, maybe at the other end: reset the GPU or reboot"),
    79: XidClass("fault", "the GPU has fallen off the bus: reboot the node"),
    95: XidClass("fault", "an uncorrectable ECC error: reset the GPU"),
    109: XidClass("fault", "the GPU stopped processing: reset it"),
    119: XidClass("fault", "its GSP firmware stopped answering: reset the GPU or reboot"),
    120: XidClass("fault", "its GSP firmware stopped answering: reset the GPU or reboot"),
    140: XidClass("fault", "an uncorrectable ECC error: reset the GPU"),
    154: XidClass("fault", "the driver's recovery action changed"),
}
UNLISTED = XidClass("information", "information or cleanup")


def xid_class(xid: int) -> XidClass:
    return XIDS.get(xid, UNLISTED)


RECENT_SECONDS = {"fault": 900.0, "application": 600.0}  # how long after it an Xid still alerts
# nvmlGpuRecoveryAction_t: what the driver asks for; 3 (drain P2P) and 5 (recover the IMEX domain) are not a fault
# of this GPU.
RECOVERY_ACTIONS = {0: "none", 1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset",
                    5: "recover the IMEX domain", 6: "bus reset", 7: "system reboot"}
RECOVERY_NOT_FAULTS = frozenset({0, 3, 5})


@dataclass(frozen=True)
class XidCount:
    gpu: str
    uuid: str
    xid: str
    count: int
    last: float  # when the last one was received, seconds since the epoch


class XidEvents:
    """Counts of Xid events by GPU and Xid since the exporter started, from one thread on NVML's event API."""

    def __init__(self, nvml: Nvml, wall: Callable[[], float] = time.time) -> None:
        self.nvml, self._wall = nvml, wall
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._last: dict[tuple[str, str, str], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def counts(self) -> list[XidCount]:
        with self._lock:
            return [XidCount(*key, count, self._last[key]) for key, count in sorted(self._counts.items())]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="NVML events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            if not self.nvml.available():
                self._stop.wait(backoff)
                continue
            try:
                self._listen()
                backoff = 1.0
            except pynvml.NVMLError as exc:
                log.warning("NVML events stopped (%s: %s); registering again in %.0fs", type(exc).__name__, exc,
                            backoff)
                self.nvml.lost(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _listen(self) -> None:
        """Register every GPU's supported events, then wait for them until stopped or an error."""
        events = pynvml.nvmlEventSetCreate()
        try:
            registered = 0
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                try:
                    mask = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & WANTED
                    if mask:
                        pynvml.nvmlDeviceRegisterEvents(handle, mask, events)
                        registered += 1
                except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission) as exc:
                    log.info("GPU %d: no NVML events (%s)", index, type(exc).__name__)
            log.info("NVML events registered on %d GPUs", registered)
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                self._record(data)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(events)

    def _record(self, data: object) -> None:
        kind, value = int(data.eventType), int(data.eventData)  # type: ignore[attr-defined]
        if kind & pynvml.nvmlEventTypeGpuRecoveryAction:
            log.warning("GPU recovery action changed (event data %d)", value)  # read with the GPU's fields
            return
        xid = value if kind & pynvml.nvmlEventTypeXidCriticalError else FALLEN_OFF_THE_BUS
        try:
            index = str(pynvml.nvmlDeviceGetIndex(data.device))  # type: ignore[attr-defined]
            uuid = as_str(pynvml.nvmlDeviceGetUUID(data.device))  # type: ignore[attr-defined]
        except pynvml.NVMLError:
            index, uuid = "", ""  # a GPU that fell off the bus may no longer say who it is
        log.warning("Xid %d on GPU %s %s", xid, index or "?", uuid)
        key = (index, uuid, str(xid))
        with self._lock:
            self._counts[key] += 1
            self._last[key] = self._wall()
