"""Xid lines from the kernel log, and untrusted bytes in it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from stallwatch.report.model import XidInfo
from stallwatch.report.render import xid_text
from stallwatch.signals.kmsg import LINE_LIMIT, KernelXid, KernelXids, parse
from stallwatch.signals.xid import xid_class
from support.harness import poll

BOOT = 1_700_000_000.0


# Real lines (docs/research/gpu-health.md §1.1, with their sources).
REAL = [
    # leptonai/gpud PR #46
    (b"NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH "
     b"TIMEOUT, Info 0x58005",
     KernelXid("0000:cb:00", 109, 1797828, "pt_main_thread",
               "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005", 0.0)),
    # NVIDIA/open-gpu-kernel-modules#1151: no process context
    (b"NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     KernelXid("0000:2b:00", 79, None, "", "GPU has fallen off the bus.", 0.0)),
    # open-gpu-kernel-modules#446
    (b"NVRM: Xid (PCI:0000:61:00): 119, pid=1346198, name=nvidia-smi, Timeout waiting for RPC from GSP! Expected "
     b"function 103 (GSP_RM_ALLOC)",
     KernelXid("0000:61:00", 119, 1346198, "nvidia-smi",
               "Timeout waiting for RPC from GSP! Expected function 103 (GSP_RM_ALLOC)", 0.0)),
    # NVIDIA forum 371272
    (b"NVRM: Xid (PCI:0000:3B:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     KernelXid("0000:3b:00", 154, None, "", "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
               0.0)),
    # MIG, and a process the driver could not name (kernel_rc.c)
    (b"NVRM: Xid (PCI:0000:61:00 GPU-I:01 GPU-CI:00): 45, pid='<unknown>', name=<unknown>, Ch 00000001 caused by "
     b"previous Xid 149",
     KernelXid("0000:61:00", 45, None, "<unknown>", "Ch 00000001 caused by previous Xid 149", 0.0)),
]


@pytest.mark.parametrize(("line", "expected"), REAL, ids=[e.detail[:30] for _, e in REAL])
def test_real_xid_lines(line: bytes, expected: KernelXid) -> None:
    found = parse(b"3,1742,12500000,-;" + line, BOOT)
    assert found is not None
    assert (found.pci, found.xid, found.pid, found.process, found.detail) == \
        (expected.pci, expected.xid, expected.pid, expected.process, expected.detail)
    assert found.at == BOOT + 12.5  # /dev/kmsg's microseconds since boot


def test_other_lines_and_untrusted_bytes() -> None:
    assert parse(b"6,1,1,-;NVRM: GPU at PCI:0000:cb:00: GPU-8d9c1c3a-0000-4000-8000-000000000000", BOOT) is None
    assert parse(b"6,2,1,-;usb 1-1: new high-speed USB device", BOOT) is None
    # A process names itself: its name and the rest are shown with control characters escaped, and bounded.
    found = parse(b"NVRM: Xid (PCI:0000:cb:00): 13, pid=42, name=\x1b[2J\xff, " + b"x" * 5000, BOOT)
    assert found is not None and found.process == "\\x1b[2J\ufffd" and len(found.detail) == 200
    assert abs(found.at - time.time()) < 60  # a line without the record prefix: read now


def test_a_log_that_grows_with_garbage_and_a_long_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "kmsg"
    reader = KernelXids(str(log), interval=0.05, boot=lambda: BOOT)
    caplog.set_level(logging.INFO, logger="stallwatch.signals.kmsg")
    reader.start()
    try:
        # Missing (a pod has no /dev/kmsg): said once, and the reader keeps trying.
        poll(lambda: "No such file" in caplog.text, what="the missing log's message")
        assert reader.latest() == []
        with log.open("wb") as out:
            out.write(b"6,1,1000000,-;NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=python3, Graphics Exception\n")
            out.write(b"\x00\xff" * 100 + b"\n")
            out.flush()
            found = poll(lambda: reader.latest(), what="the first Xid line")
            assert [(x.xid, x.pid, x.count, x.at) for x in found] == [(13, 7, 1, BOOT + 1)]
            out.write(b"y" * (LINE_LIMIT * 2))  # no newline: dropped as it grows past LINE_LIMIT, not kept
            out.flush()
            out.write(b"\n6,2,2000000,-;NVRM: Xid (PCI:0000:cb:00): 13, pid=8, name=python3, again\n"
                      b"6,3,3000000,-;NVRM: Xid (PCI:0000:cc:00): 79, GPU has fallen off the bus.\n")
            out.flush()
            found = poll(lambda: len(reader.latest()) == 2 and reader.latest(), what="the next two lines")
        by_xid = {x.xid: x for x in found}
        assert (by_xid[13].pid, by_xid[13].count, by_xid[13].detail) == (8, 2, "again")
        assert by_xid[79].pci == "0000:cc:00"
        assert caplog.text.count("No such file") == 1
    finally:
        reader.stop()


DRIVER = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=5, name=pt_main_thread, GPU has fallen off the bus."


def test_only_the_drivers_own_records_count() -> None:
    """An unprivileged user cannot pass a line of its own for the driver's Xid (docs/research/audit-2026-12-02.md
    #2). In a user namespace of its own it mounts an overlay whose lowerdir is the driver's words: the kernel logs
    them inside overlayfs's error, not at the message's start. Its write to /dev/kmsg gets the user facility
    (priority 8 and up: "it is not possible to inject messages from userspace with the facility number LOG_KERN",
    Linux Documentation/ABI/testing/dev-kmsg). Neither is an Xid; the driver's record, at any level, is."""
    assert parse(b"3,900,12500000,-;overlayfs: failed to resolve '/" + DRIVER + b"': -2", BOOT) is None
    assert parse(b"4,901,12500000,-;tmpfs: Unknown parameter '" + DRIVER + b"'", BOOT) is None
    for priority in (8, 11, 12, 14, 1027):  # user.err, user.warning, ...; local0 (16 * 8) + 3
        assert parse(b"%d,902,12500000,-;" % priority + DRIVER, BOOT) is None, priority
    for line in (b"overlayfs: failed to resolve '/" + DRIVER + b"': -2",  # a plain file: the same at the start
                 b"[   12.500000] overlayfs: failed to resolve '/" + DRIVER + b"': -2",
                 b"Dec  2 17:00:00 node1 kernel: overlayfs: failed to resolve '/" + DRIVER + b"': -2"):
        assert parse(line, BOOT) is None, line
    for level in range(8):
        found = parse(b"%d,903,12500000,-;" % level + DRIVER, BOOT)
        assert found is not None and (found.pci, found.xid, found.pid, found.at) == ("0000:3b:00", 79, 5, BOOT + 12.5)
    for line in (b"[   12.500000] " + DRIVER, b"Dec  2 17:00:00 node1 kernel: [   12.500000] " + DRIVER,
                 b"2026-12-02T17:00:00.123456+00:00 node1 kernel: " + DRIVER):  # dmesg, kern.log
        found = parse(line, BOOT)
        assert found is not None and (found.xid, found.process) == (79, "pt_main_thread"), line


def test_a_process_name_cannot_reverse_the_line_or_forge_the_error_text() -> None:
    """A process names itself (prctl PR_SET_NAME, 15 bytes), and the driver writes the name unquoted
    (docs/research/audit-2026-12-02.md #13): U+202E in it would reverse the rest of the line on the status page,
    and `x, errorString ` would read as the start of the driver's words. The bidi control is escaped, the name
    keeps its commas, and the report quotes it."""
    found = parse(b"NVRM: Xid (PCI:0000:3b:00): 13, pid=4, name=\xe2\x80\xaenimda\x1b]0;OWNED\x07, Graphics Exception",
                  BOOT)
    assert found is not None and (found.process, found.detail) == ("\\u202enimda\\x1b]0;OWNED\\x07",
                                                                   "Graphics Exception")
    found = parse(b"3,5,1,-;NVRM: Xid (PCI:0000:3b:00): 109, pid=4, name=x, errorString , Ch 00000008, errorString "
                  b"CTX SWITCH TIMEOUT", BOOT)
    assert found is not None and (found.process, found.detail) == ("x, errorString",
                                                                   "Ch 00000008, errorString CTX SWITCH TIMEOUT")
    # /dev/kmsg writes a name's bytes that are not printable ASCII as `\xNN`: each counts as one of the 15.
    found = parse(b"3,6,1,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=4, name=\\xe2\\x80\\xaenimda, x, Graphics Exception",
                  BOOT)
    assert found is not None and (found.process, found.detail) == ("\\xe2\\x80\\xaenimda, x", "Graphics Exception")
    known = xid_class(109)
    text = xid_text(XidInfo(109, 1, 60.0, known.kind, known.meaning, 4, "x, errorString", "", "Ch 00000008"))
    assert text.endswith('; pid 4 "x, errorString" (not this server\'s): Ch 00000008')


def test_a_plain_file_log_is_followed_across_rotation_and_truncation(tmp_path: Path) -> None:
    """A kernel log that logrotate rotates (`paths.kmsg: /var/log/kern.log`, where /dev/kmsg is not mounted) is
    followed to the new file at its path, and read again from its start when copytruncate cuts it
    (docs/research/audit-2026-12-02.md #16): before, the reader stayed on the old file and went blind."""
    log = tmp_path / "kern.log"
    reader = KernelXids(str(log), boot=lambda: BOOT)

    def line(xid: int, pid: int) -> bytes:
        return b"[   12.500000] NVRM: Xid (PCI:0000:3b:00): %d, pid=%d, name=python3, detail\n" % (xid, pid)

    def seen() -> list[tuple[int, int | None, int]]:
        reader._read()  # one pass of the loop
        return sorted((x.xid, x.pid, x.count) for x in reader.latest())

    log.write_bytes(line(13, 1))
    assert seen() == [(13, 1, 1)]
    with log.open("ab") as out:  # the writer still appends to the old file, then it is renamed away
        log.rename(tmp_path / "kern.log.1")
        out.write(line(13, 2))
    log.write_bytes(line(62, 3))
    assert seen() == [(13, 2, 2), (62, 3, 1)]  # the old file read to its end, then the new one
    with log.open("ab") as out:  # copytruncate: the file is cut and written again from its start
        log.write_bytes(b"")
        out.write(line(48, 4))
    assert seen() == [(13, 2, 2), (48, 4, 1), (62, 3, 1)]
    assert seen() == [(13, 2, 2), (48, 4, 1), (62, 3, 1)]  # each line once
    reader.stop()
    reader._read()


def test_a_one_shot_read_has_every_line_so_far_in_the_callers_thread_and_closes_the_log(tmp_path: Path) -> None:
    """`stallwatch diagnose` reads the log once, never starting the loop (audit 2026-12-02 #12)."""
    path = tmp_path / "kern.log"
    path.write_bytes(b"NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
    xids = KernelXids(str(path))
    xids.read_once()
    assert [(x.pci, x.xid) for x in xids.latest()] == [("0000:3b:00", 79)]
    assert xids._fd is None  # nothing left open by a reader that has no loop to close it
