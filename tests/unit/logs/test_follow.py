"""Following one log: rotation, truncation, deletion, late files, symlinks, binary bytes, UTF-16, endless lines,
FIFOs and unreadable paths, each reported in its `FileStats`, never fatal; a restarted exporter recovers the phase
from a bounded replay."""

from __future__ import annotations

import os
import threading
import tracemalloc
from pathlib import Path

import pytest

from stallwatch.logs import follow as logfollow
from stallwatch.logs.follow import LogFile
from support import transcripts as t
from support.clock import Clock
from support.watchers import append, log_watcher, manager, phase, stats, watcher_with_logs

LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"


LOAD = b"[2026-11-20 09:14:13] Load weight begin. avail mem=78.54 GB\n"


def test_file_swapped_for_a_fifo_between_stat_and_open_does_not_block(tmp_path: Path) -> None:
    """A log file replaced, between the follower's stat and its open, by a FIFO that nobody writes would block the
    only log thread in `open` for good. The follower opens it non-blocking and refuses it as `not a regular file`."""
    watcher, (path,) = watcher_with_logs(tmp_path, 1)
    server = watcher.servers()[0]
    follower = LogFile(server.name, server.launch.log_sources[0], server.interpreter)
    before = os.stat(path)  # what the follower's stat saw
    path.unlink()
    os.mkfifo(path)  # ... and what is there when it opens: nobody ever writes it
    errors: list[BaseException] = []

    def switch() -> None:
        try:
            follower._switch(before)
        except OSError as exc:
            errors.append(exc)

    thread = threading.Thread(target=switch, daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    if blocked:  # unblock the stuck open, so the test ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert not blocked, "the follower blocked on a FIFO"
    assert errors and "not a regular file" in str(errors[0])


def test_a_log_read_behind_its_end_grew_when_its_size_did(tmp_path: Path) -> None:
    """A follower held behind a log's end by its per-pass read budget (docs/research/audit-2026-12-01.md #7) must not
    date the log's growth by when it reads the backlog, or a server that stopped writing would look alive for as long
    as the backlog lasts. The log grew when the file's size did; the bytes read are counted as they are read."""
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    server = log_watcher({"s": [path]}).servers()[0]
    follower = LogFile(server.name, server.launch.log_sources[0], server.interpreter, wall=clock, recover=False)
    path.write_bytes(b"x" * 99 + b"\n" + b"y" * ((3 << 20) - 100))
    assert follower.poll(deadline=0.0)  # one chunk a poll, past its deadline: more is left
    grew = clock.now
    clock.now += 10
    assert follower.poll(deadline=0.0)
    assert follower.stats().last_growth == grew and follower.stats().read_bytes == 2 << 20
    with open(path, "ab") as f:
        f.write(b"\n")
    assert not follower.poll()
    assert follower.stats().last_growth == clock.now and follower.stats().read_bytes == (3 << 20) + 1


def test_rotation_by_rename_reads_the_old_file_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    append(log, LAUNCH)
    m, watcher, _ = manager(log)
    m.poll()
    append(log, b"one\n")
    with open(log, "ab") as writer:  # the server keeps writing to the renamed file for a moment
        os.rename(log, tmp_path / "server.log.1")
        writer.write(b"two\n")
    append(log, LOAD)
    m.poll()
    s = stats(m)
    assert s.up and s.lines == 3  # one, two, and the new file's line; the launch was before following
    assert s.read_bytes == len(b"one\ntwo\n") + len(LOAD)
    assert phase(watcher) == "loading_weights"


def test_copytruncate_starts_over_and_counters_stay_monotonic(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    append(log, LAUNCH + b"x" * 100 + b"\n")
    m.poll()
    before = stats(m)
    with open(log, "r+b") as f:
        f.truncate(0)
    append(log, LOAD)
    m.poll()
    after = stats(m)
    assert after.read_bytes == before.read_bytes + len(LOAD)
    assert after.lines == before.lines + 1 and after.size == len(LOAD)
    assert phase(watcher) == "loading_weights"


def test_deleted_then_recreated(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    append(log, LAUNCH)
    m.poll()
    log.unlink()
    m.poll()
    assert stats(m).up is False
    log.write_bytes(LOAD)
    m.poll()
    s = stats(m)
    assert s.up and s.read_bytes == len(LAUNCH) + len(LOAD) and s.lines == 2
    assert phase(watcher) == "loading_weights"


def test_file_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    m, watcher, clock = manager(log)
    m.poll()
    s = stats(m)
    assert not s.up and s.size is None and s.last_growth is None
    log.write_bytes(LAUNCH + LOAD)
    clock.now += 5
    m.poll()
    s = stats(m)
    assert s.up and s.read_bytes == len(LAUNCH + LOAD) and s.last_growth == clock.now
    assert phase(watcher) == "loading_weights"


def test_repointed_symlink_follows_the_new_target(tmp_path: Path) -> None:
    (tmp_path / "a.log").write_bytes(b"")
    link = tmp_path / "current.log"
    link.symlink_to(tmp_path / "a.log")
    m, watcher, _ = manager(link)
    m.poll()
    append(tmp_path / "a.log", LAUNCH)
    m.poll()
    (tmp_path / "b.log").write_bytes(LOAD)
    tmp_link = tmp_path / "tmp.link"
    tmp_link.symlink_to(tmp_path / "b.log")
    os.replace(tmp_link, link)
    m.poll()
    assert stats(m).read_bytes == len(LAUNCH) + len(LOAD)
    assert phase(watcher) == "loading_weights"


def test_binary_and_invalid_utf8(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    # Not at the top of the file, where `FF FE` is a UTF-16 byte-order mark.
    append(log, LAUNCH + b"\xff\xfe\x00\x01\x80 not utf-8 \xc3\x28\n" + b"\x00" * 1000 + b"\n" + LOAD)
    m.poll()
    assert stats(m).lines == 4 and phase(watcher) == "loading_weights"


UTF16 = {"utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}


def utf16(codec: str, data: bytes) -> bytes:
    return data.decode().encode(codec)


@pytest.mark.parametrize("codec", UTF16)
def test_a_utf16_log_reads_as_its_utf8_text(tmp_path: Path, codec: str) -> None:
    """PowerShell's `>` (Windows, WSL) writes UTF-16 with a BOM: its lines read as the engine's UTF-8, a code unit
    split between two writes included; the bytes read are the file's, as its size is."""
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    fed: list[bytes] = []
    watcher.servers()[0].interpreter.tap = fed.append
    text = LAUNCH + LOAD.replace(b"\n", b"\r\n")
    data = UTF16[codec] + utf16(codec, text)
    for part in (data[:1], data[1:101], data[101:]):  # half the BOM, then half a code unit
        append(log, part)
        m.poll()
    s = stats(m)
    assert (s.lines, s.read_bytes, s.size) == (2, len(data), len(data))
    assert phase(watcher) == "loading_weights" and b"".join(fed) == text


@pytest.mark.parametrize("rotate", ["rename", "copytruncate"])
def test_a_utf16_log_rotated_to_utf8_is_read_as_utf8(tmp_path: Path, rotate: str) -> None:
    """A new file (or the same one truncated) starts the detection anew: its UTF-8 is not read as UTF-16."""
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    old = UTF16["utf-16-le"] + utf16("utf-16-le", LAUNCH)
    append(log, old)
    m.poll()
    assert phase(watcher) == "launching"
    if rotate == "rename":
        os.rename(log, tmp_path / "server.log.1")
    else:
        with open(log, "r+b") as f:
            f.truncate(0)
    append(log, LOAD)
    m.poll()
    s = stats(m)
    assert (s.lines, s.read_bytes) == (2, len(old) + len(LOAD))
    assert phase(watcher) == "loading_weights"


def test_progress_bar_without_newline_is_activity(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(LAUNCH + LOAD)
    m, watcher, clock = manager(log)
    m.poll()
    lines = stats(m).lines
    clock.now += 60
    append(log, b"\rLoading safetensors checkpoint shards:   5% Completed | 3/64 [00:15<05:00,  5.01s/it]")
    append(log, b"\rLoading safetensors checkpoint shards:   6% Completed | 4/64 [00:20<05:00,  5.01s/it]")
    m.poll()
    s = stats(m)
    assert s.lines == lines and s.last_growth == clock.now
    snap = watcher.servers()[0].interpreter.snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == (3, 64)


@pytest.mark.parametrize("codec", ["utf-8", "utf-16-le"])
def test_100_mb_line_without_newline_keeps_memory_bounded(tmp_path: Path, codec: str) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    bom = b"\xff\xfe" if codec == "utf-16-le" else b""  # the line bound holds in UTF-16 too
    unit = "x".encode(codec)
    block = unit * ((4 << 20) // len(unit))
    with open(log, "ab") as f:
        f.write(bom)
        for _ in range(25):
            f.write(block)
    tracemalloc.start()
    m.poll()
    m.poll()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stats(m).read_bytes == (100 << 20) + len(bom)
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while reading a 100 MB line"
    append(log, (b"\n" + LAUNCH).decode().encode(codec))
    m.poll()
    assert phase(watcher) == "launching" and stats(m).lines == 2


def test_unreadable_path_is_down_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "not-a-file.log"
    directory.mkdir()
    m, _, _ = manager(directory)
    for _ in range(3):
        m.poll()
    assert stats(m).up is False
    assert len([r for r in caplog.records if "not readable" in r.getMessage()]) == 1


def test_restart_recovers_phase_from_the_last_launch_without_counting_events(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes((t.sglang_graph_crash(tp=2) + t.sglang_healthy(tp=2)).encode())
    mtime = 1_700_000_000
    os.utime(log, (mtime, mtime))
    m, watcher, _ = manager(log)
    m.poll()
    snap = watcher.servers()[0].interpreter.snapshot()
    assert snap.phase == "serving" and (snap.shards_loaded, snap.shards_expected) == (64, 64)
    assert sum(snap.events.values()) == 0  # old lines are not new events
    assert snap.since <= mtime
    s = stats(m)
    assert s.last_growth == mtime and s.read_bytes == 0


@pytest.mark.parametrize("codec", UTF16)
def test_restart_recovers_a_utf16_log_from_a_window_in_its_middle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   codec: str) -> None:
    """The replay of a restarted exporter begins after a newline in the middle of the file, where the BOM is not
    read and the offset may be odd (UTF-16LE's `\\n` is `0A 00`): the file's first bytes still decide."""
    monkeypatch.setattr(logfollow, "CHUNK_BYTES", 4096)
    log = tmp_path / "server.log"
    log.write_bytes(UTF16[codec] + (t.sglang_graph_crash(tp=2) + t.sglang_healthy(tp=2)).encode(codec))
    m, watcher, _ = manager(log)
    fed: list[bytes] = []
    watcher.servers()[0].interpreter.tap = fed.append
    m.poll()
    snap = watcher.servers()[0].interpreter.snapshot()
    assert snap.phase == "serving" and (snap.shards_loaded, snap.shards_expected) == (64, 64)
    assert sum(snap.events.values()) == 0
    assert b"".join(fed).count(b"server_args=") == 1  # from the window of the last launch, not the top


def test_restart_scans_back_a_bounded_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfollow, "RECOVERY_BYTES", 1 << 20)
    log = tmp_path / "server.log"
    # A fatal line far back, then 2 MB of serving output: only the last 1 MB is read again.
    log.write_bytes((t.sglang_graph_crash(tp=2) + "".join(t.sglang_decode(12000))).encode())
    m, watcher, _ = manager(log)
    m.poll()
    assert phase(watcher) == "serving"
