"""Following logs: rotation, truncation, deletion, symlinks, binary bytes, endless lines, FIFOs and shared files,
each reported in the follower's figures, never fatal."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from stallwatch.collectors import StallwatchCollector
from stallwatch.collectors.logs import LogsCollector
from stallwatch.discovery.watcher import Watcher
from stallwatch.discovery.workload import LogSource
from stallwatch.signals import logs as logfollow
from stallwatch.signals.logs import FileStats, LogFile, LogManager
from support import transcripts
from support import transcripts as t
from support.clock import Clock
from support.harness import poll
from support.watchers import log_watcher


def _watcher_with_logs(tmp_path: Path, count: int) -> tuple[Watcher, list[Path]]:
    files = [tmp_path / f"{i}.log" for i in range(count)]
    for f in files:
        f.write_bytes(b"hello\n")
    return log_watcher({f"s{i}": [f] for i, f in enumerate(files)}), files


def _success(root: StallwatchCollector, name: str) -> float:
    family = next(f for f in root.collect() if f.name == "stallwatch_collector_success")
    return next(s.value for s in family.samples if s.labels["collector"] == name)


TRACEBACK = b"Traceback (most recent call last)\n"


LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"


LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"


LOAD = b"[2026-11-20 09:14:13] Load weight begin. avail mem=78.54 GB\n"


def manager(*logs: str | Path) -> tuple[LogManager, Watcher, Clock]:
    watcher = log_watcher({"s": logs})
    clock = Clock()
    return LogManager(watcher, poll_interval=1.0, wall=clock), watcher, clock


def stats(m: LogManager, path: str | Path | None = None) -> FileStats:
    found = [s for s in m.stats() if path is None or s.path == str(path)]
    assert len(found) == 1, m.stats()
    return found[0]


def phase(watcher: Watcher) -> str:
    return watcher.servers()[0].interpreter.snapshot().phase


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_file_swapped_for_a_fifo_between_stat_and_open_does_not_block(tmp_path: Path) -> None:
    """A log file replaced, between the follower's stat and its open, by a FIFO that nobody writes would block the
    only log thread in `open` for good. The follower opens it non-blocking and refuses it as `not a regular file`."""
    watcher, (path,) = _watcher_with_logs(tmp_path, 1)
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


def test_one_bad_file_is_its_own_log_up_0_and_the_others_go_on(tmp_path: Path) -> None:
    """A log source on which the follower raises something other than OSError (a NUL in its path: ValueError, which
    the config now refuses) would end the pass for every server. Only that file is `log_up 0`, and the other server's
    file is read."""
    watcher, _ = _watcher_with_logs(tmp_path, 2)
    bad = watcher.servers()[0]
    # What config now refuses: ValueError.
    bad.launch = dataclasses.replace(bad.launch, log_sources=(LogSource("/var/log/x\0y", "/var/log/x\0y"),))
    manager = LogManager(watcher, 0.1)
    manager.poll()
    stats = {s.server: s for s in manager.stats()}
    assert stats["s0"].up is False
    assert stats["s1"].up is True and stats["s1"].size == len("hello\n")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the loop that dies
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_dead_or_stuck_follower_fails_the_logs_collector(tmp_path: Path, how: str) -> None:
    """A log follower loop that dies (SystemExit, which its own guard does not catch) or hangs would leave frozen log
    figures exported as fresh. The logs collector then fails, `stallwatch_collector_success{collector=logs} 0`, once
    the loop has ended or has not finished a pass for `stale_after`."""
    watcher, _ = _watcher_with_logs(tmp_path, 1)
    manager = LogManager(watcher, 0.05, stale_after=0.5)
    root = StallwatchCollector({"logs": LogsCollector(manager, watcher)})
    stuck = threading.Event()

    def broken() -> None:
        if how == "dies":
            raise SystemExit  # not an Exception: the loop's own guard does not catch it
        stuck.wait(30)

    manager.poll = broken  # type: ignore[method-assign]
    manager.start()
    try:
        poll(lambda: _success(root, "logs") == 0, what="collector_success{collector=logs} 0")
    finally:
        stuck.set()
        manager.stop()


def test_a_file_of_notable_lines_does_not_hold_back_another_servers_log(tmp_path: Path) -> None:
    """The follower replayed and read a file of tracebacks for minutes before it looked at any other file."""
    hostile, real = tmp_path / "hostile.log", tmp_path / "real.log"
    hostile.write_bytes(TRACEBACK * ((16 << 20) // len(TRACEBACK)))
    real.write_bytes(b"")
    watcher = log_watcher({"hostile": [hostile], "real": [real]})
    servers = {s.name: s for s in watcher.servers()}
    fed: list[int] = []
    seen_after: list[int] = []

    def hostile_tap(block: bytes) -> None:
        if not fed:  # the real server writes while the follower is busy with the other file
            real.write_bytes(LAUNCH)
        fed.append(len(block))

    servers["hostile"].interpreter.tap = hostile_tap
    servers["real"].interpreter.tap = lambda block: seen_after.append(sum(fed))
    manager = LogManager(watcher, poll_interval=0.1)
    manager.start()
    try:
        poll(lambda: servers["real"].interpreter.snapshot().phase == "launching", timeout=60,
             what="the real server's line")
    finally:
        manager.stop()
    assert seen_after[0] < hostile.stat().st_size / 2, "the real line waited for the other file"


def test_a_file_shared_by_several_servers_is_replayed_once(tmp_path: Path) -> None:
    """Several processes with one file as their stdout (a neighbour's 64 MiB of tracebacks, held by five sleepers)
    made the follower replay up to 64 MiB of it for each of them (docs/research/audit-2026-12-01.md #7). The file's
    (device, inode) is replayed once, for one server (the others start at its end, `stopped`), and what is appended
    later reaches all three."""
    shared = tmp_path / "shared.log"
    shared.write_bytes(transcripts.sglang_healthy(tp=1).encode())
    watcher = log_watcher({f"s{i}": [shared] for i in range(3)})
    manager = LogManager(watcher, poll_interval=1.0)
    manager.poll()
    phases = sorted(s.interpreter.snapshot().phase for s in watcher.servers())
    assert phases == ["serving", "stopped", "stopped"]
    with open(shared, "ab") as f:
        f.write(LAUNCH)
    manager.poll()  # what is new reaches every server
    assert [s.interpreter.snapshot().phase for s in watcher.servers()] == ["launching"] * 3


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


def test_glob_that_gains_files_feeds_one_phase(tmp_path: Path) -> None:
    (tmp_path / "tp0.log").write_bytes(b"")
    m, watcher, _ = manager(tmp_path / "*.log")
    m.poll()
    append(tmp_path / "tp0.log", LAUNCH)
    m.poll()
    assert phase(watcher) == "launching"
    (tmp_path / "tp1.log").write_bytes(LOAD)
    m.poll()
    assert {s.path for s in m.stats()} == {str(tmp_path / "tp0.log"), str(tmp_path / "tp1.log")}
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
    append(log, b"\xff\xfe\x00\x01\x80 not utf-8 \xc3\x28\n" + LAUNCH + b"\x00" * 1000 + b"\n" + LOAD)
    m.poll()
    assert stats(m).lines == 4 and phase(watcher) == "loading_weights"


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


def test_100_mb_line_without_newline_keeps_memory_bounded(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll()
    block = b"x" * (4 << 20)
    with open(log, "ab") as f:
        for _ in range(25):
            f.write(block)
    tracemalloc.start()
    m.poll()
    m.poll()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stats(m).read_bytes == 100 << 20
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB while reading a 100 MB line"
    append(log, b"\n" + LAUNCH)
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
    phase_name, since, loaded, total, events = watcher.servers()[0].interpreter.snapshot()
    assert phase_name == "serving" and (loaded, total) == (64, 64)
    assert sum(events.values()) == 0  # old lines are not new events
    assert since <= mtime
    s = stats(m)
    assert s.last_growth == mtime and s.read_bytes == 0


def test_restart_scans_back_a_bounded_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logfollow, "RECOVERY_BYTES", 1 << 20)
    log = tmp_path / "server.log"
    # A fatal line far back, then 2 MB of serving output: only the last 1 MB is read again.
    log.write_bytes((t.sglang_graph_crash(tp=2) + "".join(t.sglang_decode(12000))).encode())
    m, watcher, _ = manager(log)
    m.poll()
    assert phase(watcher) == "serving"


def test_follows_in_background_with_inotify(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll_interval = 30  # so only an inotify event can wake it in time
    m.start()
    try:
        time.sleep(0.3)
        append(log, LAUNCH)
        deadline = time.monotonic() + 5
        while phase(watcher) != "launching":
            assert time.monotonic() < deadline, "inotify did not wake the follower"
            time.sleep(0.02)
    finally:
        m.stop()
