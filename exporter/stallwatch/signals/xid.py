"""Xid errors from NVML's event API, without DCGM or the kernel log: each GPU has its own event set and thread
(`GpuEvents`), which registers the supported subset of `nvmlEventTypeXidCriticalError`,
`nvmlEventTypeGpuUnavailableError` and `nvmlEventTypeGpuRecoveryAction` on that GPU (`nvmlDeviceRegisterEvents`) and
waits on them (`nvmlEventSetWait_v2`, one second at a time, so that it stops promptly); on an error other than the
wait's timeout it frees its set and builds a new one, with backoff.

A GPU whose firmware stops answering (Xid 119) blocks every call on it for tens of seconds, registration too: one set
per GPU keeps that to the hung GPU. A GPU registers only while it answers (`Nvml.answering`: its reads are in time),
so an exporter started while one GPU hangs registers the others at once and the hung one once it answers (said once
it has waited `gpu.timeout`). An event is counted under the GPU of its set, named from what that GPU said before
(`devices.Identity`): no call asks a GPU that may hang who it is.

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

from stallwatch.loops import run_every
from stallwatch.signals.devices import Identity
from stallwatch.signals.nvml import Nvml

log = logging.getLogger(__name__)

WAIT_MS = 1000
ANSWER_POLL_SECONDS = 0.5  # how often a GPU not yet registered is looked at (no NVML call)
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
    119: XidClass("fault", "a GSP RPC timeout: its firmware stopped answering; reset the GPU or reboot"),
    120: XidClass("fault", "a GSP error: its firmware stopped answering; reset the GPU or reboot"),
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
    """Counts of Xid events by GPU and Xid since the exporter started: the `NVML events` thread starts one
    `GpuEvents` thread for each GPU the survey counts."""

    def __init__(self, nvml: Nvml, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml, self._wall, self._clock = nvml, wall, clock
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._last: dict[tuple[str, str, str], float] = {}
        self._stop = threading.Event()
        self._gpus: dict[int, GpuEvents] = {}

    def counts(self) -> list[XidCount]:
        with self._lock:
            return [XidCount(*key, count, self._last[key]) for key, count in sorted(self._counts.items())]

    def start(self) -> None:
        run_every(1.0, self.start_gpus, "NVML events", self._stop)

    def stop(self) -> None:
        self._stop.set()

    def start_gpus(self) -> None:
        """A thread for each GPU counted that has none yet (no NVML call)."""
        for index in self.nvml.indices():
            if index not in self._gpus:
                self._gpus[index] = GpuEvents(index, self.nvml, self.record, self._stop, self._clock)
                threading.Thread(target=self._gpus[index].run, name=f"NVML events GPU {index}", daemon=True).start()

    def record(self, identity: Identity, data: object) -> None:
        """One event from `identity`'s set, counted under the GPU it is."""
        kind, value = int(data.eventType), int(data.eventData)  # type: ignore[attr-defined]
        if kind & pynvml.nvmlEventTypeGpuRecoveryAction:
            log.warning("GPU %d %s: recovery action changed (event data %d)", identity.index, identity.uuid, value)
            return  # read with the GPU's fields
        xid = value if kind & pynvml.nvmlEventTypeXidCriticalError else FALLEN_OFF_THE_BUS
        log.warning("Xid %d on GPU %d %s", xid, identity.index, identity.uuid)
        key = (str(identity.index), identity.uuid, str(xid))
        with self._lock:
            self._counts[key] += 1
            self._last[key] = self._wall()


class GpuEvents:
    """One GPU's event set on its own thread: registered while the GPU answers, waited on until stopped."""

    def __init__(self, index: int, nvml: Nvml, record: Callable[[Identity, object], None], stop: threading.Event,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index, self.nvml, self._record, self._stop, self._clock = index, nvml, record, stop, clock
        self._unsupported: int | None = None  # the NVML initialisation under which this GPU said it has no events
        self._waiting_since: float | None = None  # for an answer, to register
        self._said_waiting = False

    def run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            identity = self._registrable()
            if identity is None:
                self._stop.wait(ANSWER_POLL_SECONDS)
                continue
            try:
                self._listen(identity)
                backoff = 1.0
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission) as exc:
                log.info("GPU %d: no NVML events (%s)", self.index, type(exc).__name__)
                self._unsupported = identity.generation
            except pynvml.NVMLError as exc:
                log.warning("NVML events stopped (%s: %s) on GPU %d; registering again in %.0fs", type(exc).__name__,
                            exc, self.index, backoff)
                self.nvml.lost(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _registrable(self) -> Identity | None:
        """The GPU's identity when it answers (and has events under this initialisation); else None, said once it
        has waited `gpu.timeout` for an answer."""
        identity = self.nvml.answering(self.index)
        if identity is not None and identity.generation != self._unsupported:
            self._waiting_since, self._said_waiting = None, False
            return identity
        if identity is None and self.index in self.nvml.indices():
            now = self._clock()
            self._waiting_since = now if self._waiting_since is None else self._waiting_since
            if not self._said_waiting and now - self._waiting_since >= self.nvml.timeout:
                self._said_waiting = True
                log.warning("GPU %d: NVML events not registered: it has not answered NVML for %gs; its Xids are "
                            "counted from when it does", self.index, self.nvml.timeout)
        return None

    def _listen(self, identity: Identity) -> None:
        """Register the GPU's supported events on a set of its own, then wait for them until stopped or an error."""
        events = pynvml.nvmlEventSetCreate()
        try:
            mask = pynvml.nvmlDeviceGetSupportedEventTypes(identity.handle) & WANTED
            if not mask:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            pynvml.nvmlDeviceRegisterEvents(identity.handle, mask, events)
            log.info("NVML events registered on GPU %d %s", identity.index, identity.uuid)
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(events, WAIT_MS)
                except pynvml.NVMLError_Timeout:
                    continue
                self._record(identity, data)  # the set holds this GPU alone: the event is its own
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(events)
