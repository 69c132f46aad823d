"""The driver's Xid lines from the kernel log (`/dev/kmsg`), where it is readable. A line names the process and
says more than NVML's event does:

    NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT

(leptonai/gpud PR #46; the format is the driver's `nvErrorLog_va`, NVIDIA/open-gpu-kernel-modules). Never required:
pods have no /dev/kmsg, and with `kernel.dmesg_restrict=1` reading it needs CAP_SYSLOG. The counts and the alerts
come from NVML's events (`signals/xid.py`); these lines add who and what to the reports, and the Xids from before
the exporter started (the kernel's buffer is read from its start).

/dev/kmsg hands out one record per read, `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE`, with the time since boot;
a read after records were overwritten fails with EPIPE and the next one goes on (Linux
Documentation/ABI/testing/dev-kmsg). Only the driver's own records count: PRIORITY is facility * 8 + level, and
"it is not possible to inject messages from userspace with the facility number LOG_KERN (0)" (dev-kmsg), so a
record of another facility (a program's write to /dev/kmsg) is none; and the message must start with `NVRM: Xid`,
as the driver writes it, not merely hold it (overlayfs logs `failed to resolve '<a user's mount option>'`, audit
2026-12-02 #2).

A plain file (`dmesg` output, a syslog kern.log, a test's) is read line by line as it grows, followed across
rotation (a new file at the path) and truncation (copytruncate), like a server's log; a line without the record
prefix counts as read now, and has no facility: such a file is as trustworthy as whatever writes it. Its message
starts after an optional syslog header (`Dec  2 17:00:00 host kernel: `, RFC 3339 time too) and dmesg's
`[   12.345678] ` time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.loops import run_every
from stallwatch.text import terminal_safe

log = logging.getLogger(__name__)

READ_BYTES = 16384  # more than one /dev/kmsg record (a read with a smaller buffer fails with EINVAL)
LINE_LIMIT = 65536  # a partial line longer than this (a binary file, no newline) is dropped
TEXT_LIMIT = 200  # of the line's rest, kept for the reports
TAIL_BYTES = 256  # of a plain file, compared again at each read
KEPT = 256  # (PCI address, Xid) pairs kept, the oldest dropped first
# A /dev/kmsg record (priority at most 8 bits of facility and 3 of level); a plain file's line: its syslog header, if
# any, then dmesg's time, if any.
RECORD = re.compile(rb"^(\d{1,4}),\d{1,20},(\d{1,20}),[^;]*;(.*)$")
PLAIN_PREFIX = re.compile(rb"^(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.+-]+Z?) \S+ kernel: )?"
                          rb"(?:\[ *\d{1,12}\.\d{1,9}\] )?")
KERNEL_FACILITY = 0  # LOG_KERN
# `krcReportXid` (open-gpu-kernel-modules src/nvidia/src/kernel/gpu/rc/kernel_rc.c): `NVRM: Xid (PCI:%04x:%02x:%02x):
# %d, pid=%s, name=%s, %s`, without `pid=, name=,` outside a process's context; on MIG ` GPU-I:%02u GPU-CI:%02u` follow
# the address. Matched at the message's start only.
XID_LINE = re.compile(rb"^NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?: GPU-C?I:\d+)*\): "
                      rb"(\d{1,5})(?:, (.*))?$")
PROCESS = re.compile(rb"pid=([^,]*), name=(.*)$")  # pid='<unknown>' where the driver had none
# The name is the process's comm, which it sets itself (prctl PR_SET_NAME), unquoted by the driver, commas and all:
# at most TASK_COMM_LEN - 1 bytes, which /dev/kmsg writes as `\xNN` where they are not printable ASCII.
COMM_BYTES = 15
ESCAPED_BYTE = re.compile(rb"\\x[0-9a-fA-F]{2}")


@dataclass(frozen=True)
class KernelXid:
    pci: str  # "0000:cb:00", as `devices.pci_address` writes NVML's
    xid: int
    pid: int | None
    process: str  # the process's name as the kernel had it: untrusted, `terminal_safe`
    detail: str  # the rest of the line (channel, error string): untrusted, `terminal_safe`, at most TEXT_LIMIT
    at: float  # wall-clock time of the line
    count: int = 1  # lines for this PCI address and Xid seen so far


def parse(record: bytes, boot: float) -> KernelXid | None:
    """One record or line of the kernel log as the driver's Xid line, or None; `boot` is the wall time of boot, for
    the record's microseconds since boot."""
    at = time.time()
    found = RECORD.match(record)
    if found is not None:
        if int(found.group(1)) >> 3 != KERNEL_FACILITY:  # written to /dev/kmsg by a program, not by the kernel
            return None
        at, message = boot + int(found.group(2)) / 1e6, found.group(3)
    else:
        message = PLAIN_PREFIX.sub(b"", record, count=1)
    line = XID_LINE.match(message)
    if line is None:
        return None
    rest = line.group(3) or b""
    process = PROCESS.match(rest)
    pid, (name, detail) = (process.group(1), _name(process.group(2))) if process is not None else (b"", (b"", rest))
    return KernelXid(pci=line.group(1).decode().lower(), xid=int(line.group(2)),
                     pid=int(pid) if pid.isdigit() and len(pid) < 11 else None, process=_text(name)[:64],
                     detail=_text(detail)[:TEXT_LIMIT], at=at)


def _name(rest: bytes) -> tuple[bytes, bytes]:
    """The process's name and the driver's words after it, from what follows `name=`: the name ends at the last `, `
    that leaves it a comm's length, so that a name with commas (`x, errorString `) is not taken for the driver's
    words (audit 2026-12-02 #13); the first `, ` where none does (not a comm: a plain file's line). A name of one
    or two bytes before the driver's `Ch 0000000N, ` takes the channel in too: the driver's words shown as the name,
    never a name's as the driver's."""
    fits = [at for at in range(min(len(rest), COMM_BYTES * 4 + 1))  # 4: `\xNN`
            if rest.startswith(b", ", at) and len(ESCAPED_BYTE.sub(b"?", rest[:at])) <= COMM_BYTES]
    end = fits[-1] if fits else rest.find(b", ")
    return (rest[:end], rest[end + 2:]) if end >= 0 else (rest, b"")


def _text(raw: bytes) -> str:
    """Another process's bytes (its name is its own to choose) as a terminal or a page can show them."""
    return terminal_safe(raw.decode("utf-8", "replace")).strip()


class KernelXids:
    """The last Xid line per GPU (PCI address) and Xid, from one loop reading the kernel log every `interval`."""

    def __init__(self, path: str, interval: float = 1.0, boot: Callable[[], float] | None = None) -> None:
        self.path, self.interval = path, interval
        self._boot = boot or (lambda: time.time() - time.monotonic())  # kmsg's clock is the monotonic one
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, int], KernelXid] = {}
        self._fd: int | None = None
        self._partial = b""
        self._tail = b""  # the last bytes read from a plain file, to tell that it was rewritten
        self._error = ""
        self._stop = threading.Event()

    def latest(self) -> list[KernelXid]:
        with self._lock:
            return list(self._latest.values())

    def start(self) -> None:
        run_every(self.interval, self._read, "kernel log Xid lines", self._stop)

    def stop(self) -> None:
        self._stop.set()  # the loop closes the log after its read in progress

    def read_once(self) -> None:
        """Everything the log has now, read in the caller's thread and closed (a one-shot reader, never started)."""
        try:
            self._read()
        finally:
            self._close()

    def _read(self) -> None:
        """Everything the log has now, a plain file followed to the new one at its path; the error (no such file, no
        permission) logged once until it clears."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._drain()
            if self._replaced():  # rotated: the old file was read to its end above, the new one is read from its start
                self._close()
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
                self._drain()
        except OSError as exc:
            if self._error != str(exc):
                log.info("no Xid lines from %s (%s); NVML's events still count them", self.path, exc)
                self._error = str(exc)
            self._close()
            return
        self._error = ""
        if self._stop.is_set():
            self._close()

    def _drain(self) -> None:
        """Read the open log to its end; a plain file rewritten (copytruncate) from its start."""
        assert self._fd is not None
        plain = not stat.S_ISCHR(os.fstat(self._fd).st_mode)
        if plain and self._rewritten():
            os.lseek(self._fd, 0, os.SEEK_SET)
            self._partial = self._tail = b""
        while not self._stop.is_set():
            try:
                data = os.read(self._fd, READ_BYTES)
            except BrokenPipeError:  # records overwritten before they were read: go on from the next
                continue
            except BlockingIOError:
                break
            if not data:
                break
            if plain:
                self._tail = (self._tail + data)[-TAIL_BYTES:]
            self._lines(data)

    def _rewritten(self) -> bool:
        """Whether a plain file no longer holds the bytes read last where they were read: cut shorter, or cut and
        written again past that point (which its size alone does not tell: audit 2026-12-02 #16's Xid 48 line)."""
        assert self._fd is not None
        position = os.lseek(self._fd, 0, os.SEEK_CUR)
        return os.pread(self._fd, len(self._tail), position - len(self._tail)) != self._tail

    def _replaced(self) -> bool:
        """Whether the path names another file than the one open (a plain file rotated by rename; /dev/kmsg is not)."""
        assert self._fd is not None
        opened = os.fstat(self._fd)
        if stat.S_ISCHR(opened.st_mode):
            return False
        now = os.stat(self.path)
        return (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._partial, self._tail = None, b"", b""

    def _lines(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > LINE_LIMIT:
            self._partial = b""
        boot = self._boot()
        for line in lines:
            found = parse(line, boot)
            if found is None:
                continue
            key = (found.pci, found.xid)
            with self._lock:
                seen = self._latest.pop(key, None)  # re-inserted: the dict's order is the lines' order
                self._latest[key] = dataclasses.replace(found, count=(seen.count if seen else 0) + 1)
                while len(self._latest) > KEPT:
                    self._latest.pop(next(iter(self._latest)))
