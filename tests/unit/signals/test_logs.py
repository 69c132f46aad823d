"""The log manager: every server's logs from one thread, woken by inotify; one bad or hostile file is its own
`log_up` 0 and never holds back another server's log; a file shared by several servers is replayed once; a dead or
stuck follower fails the logs collector."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path

import pytest

from stallwatch.collectors import StallwatchCollector
from stallwatch.collectors.logs import LogsCollector
from stallwatch.config import Paths
from stallwatch.discovery.watcher import Watcher
from stallwatch.discovery.workload import Workload
from stallwatch.logs.budget import ReadLimits
from stallwatch.logs.follow import LogFile
from stallwatch.logs.source import LogSource
from stallwatch.signals.logs import LogManager
from support import transcripts
from support.harness import poll
from support.watchers import append, candidate, log_watcher, manager, phase, stats, watcher, watcher_with_logs


def _success(root: StallwatchCollector, name: str) -> float:
    family = next(f for f in root.collect() if f.name == "stallwatch_collector_success")
    return next(s.value for s in family.samples if s.labels["collector"] == name)


TRACEBACK = b"Traceback (most recent call last)\n"


LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"


LOAD = b"[2026-11-20 09:14:13] Load weight begin. avail mem=78.54 GB\n"


def test_one_bad_file_is_its_own_log_up_0_and_the_others_go_on(tmp_path: Path) -> None:
    """A log source on which the follower raises something other than OSError (a NUL in its path: ValueError, which
    the config now refuses) would end the pass for every server. Only that file is `log_up 0`, and the other server's
    file is read."""
    watcher, _ = watcher_with_logs(tmp_path, 2)
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
    watcher, _ = watcher_with_logs(tmp_path, 1)
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


def test_a_file_shared_by_several_servers_is_replayed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several processes with one file as their stdout (a neighbour's 64 MiB of tracebacks, held by five sleepers)
    made the follower replay up to 64 MiB of it for each of them (docs/research/audit-2026-12-01.md #7). The file's
    (device, inode) is replayed once (the others start at its end); its lines are no server's (SGLang's carry no
    pid: audit 2026-12-02 #6), before and after, and each of the three says the file is shared."""
    shared = tmp_path / "shared.log"
    shared.write_bytes(transcripts.sglang_healthy(tp=1).encode())
    replays: list[int] = []
    replay_start = LogFile._replay_start
    monkeypatch.setattr(LogFile, "_replay_start", lambda self, fd, size: replays.append(size) or replay_start(
        self, fd, size))
    watcher = log_watcher({f"s{i}": [shared] for i in range(3)})
    manager = LogManager(watcher, poll_interval=1.0)
    manager.poll()
    assert len(replays) == 1
    assert [s.interpreter.snapshot().phase for s in watcher.servers()] == ["stopped"] * 3
    with open(shared, "ab") as f:
        f.write(LAUNCH)
    manager.poll()
    assert [s.interpreter.snapshot().phase for s in watcher.servers()] == ["stopped"] * 3
    assert [(s.shared, s.lines) for s in manager.stats()] == [(True, 1)] * 3


def test_servers_sharing_a_stdout_file_do_not_count_each_others_relaunches_and_fatal_lines(tmp_path: Path) -> None:
    """Audit 2026-12-02 #6: B (healthy) and A (crash-looping under a supervisor) append to one file; B counted A's
    9 relaunches and 18 fatal lines. Neither counts them now; once A's log is another file, B's lines are its own."""
    shared = tmp_path / "shared.log"
    shared.write_bytes(b"")
    watcher = log_watcher({"a": [shared], "b": [shared]})
    manager = LogManager(watcher, poll_interval=1.0)
    manager.poll()
    crash = transcripts.sglang_graph_crash(tp=1).encode()
    for _ in range(3):
        append(shared, crash)
        manager.poll()
    for server in watcher.servers():
        events = server.interpreter.snapshot().events
        assert (events["server_restart"], events["fatal"]) == (0, 0), (server.name, events)
    a = next(s for s in watcher.servers() if s.name == "a")
    own = tmp_path / "a.log"
    own.write_bytes(b"")
    a.launch = dataclasses.replace(a.launch, log_sources=(LogSource(str(own), str(own)),))
    manager.poll()
    append(shared, LAUNCH)
    manager.poll()
    assert {s.server: s.shared for s in manager.stats()} == {"a": False, "b": False}
    assert next(s for s in watcher.servers() if s.name == "b").interpreter.snapshot().phase == "launching"


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


def test_follows_in_background_with_inotify(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    m, watcher, _ = manager(log)
    m.poll_interval = 3600  # so only an inotify event can wake it in time
    m.start()
    try:
        time.sleep(0.3)
        append(log, LAUNCH)
        poll(lambda: phase(watcher) == "launching", what="inotify to wake the follower")
    finally:
        m.stop()


def _an_hour_on() -> float:
    """The exporter's clock an hour on: this test's own process, the server here, is older than the exporter."""
    return time.time() + 3600


def test_lines_written_after_the_server_was_found_count_however_late_its_follower_starts(tmp_path: Path) -> None:
    """On a busy machine the follower of a log may first open it long after discovery found its server (a process
    older than the exporter, whose earlier lines are old news): what the server wrote in between is news all the
    same. A real SGLang launch, then, once the server was found, its real crash: the crash's fatal lines count."""
    log = tmp_path / "server.log"
    log.write_bytes(transcripts.real("sglang-eagle3-launch.log").encode())
    watcher = log_watcher({"s": [log]})
    server = watcher.servers()[0]
    m = LogManager(watcher, poll_interval=1.0, wall=_an_hour_on)  # the exporter, started after the process
    assert server.attach(candidate(os.getpid()), Workload(), os.getuid())  # found, with its log this long
    before = log.stat().st_size
    append(log, transcripts.real("sglang-crash-while-serving.log").encode())
    m.poll()  # the follower's first open, late
    assert server.interpreter.snapshot().events["fatal"] >= 1
    assert stats(m).read_bytes == log.stat().st_size - before


def test_a_log_as_it_was_when_its_server_was_found_is_old_news(tmp_path: Path) -> None:
    """The counter-test: the same real crash already in the log when its server was found is old news (its phase
    is recovered, its fatal lines not counted), and nothing written since counts nothing."""
    log = tmp_path / "server.log"
    crashed = transcripts.real("sglang-eagle3-launch.log") + transcripts.real("sglang-crash-while-serving.log")
    log.write_bytes(crashed.encode())
    watcher = log_watcher({"s": [log]})
    server = watcher.servers()[0]
    m = LogManager(watcher, poll_interval=1.0, wall=_an_hour_on)
    assert server.attach(candidate(os.getpid()), Workload(), os.getuid())
    m.poll()
    snap = server.interpreter.snapshot()
    assert (snap.phase, snap.events["fatal"], stats(m).read_bytes) == ("failed", 0, 0)


def test_a_server_that_exits_before_its_log_is_first_followed_has_its_last_lines_read(tmp_path: Path) -> None:
    """Discovery finds a server's log as its `/proc/PID/fd/1` link; the follower opens it in its next pass, up to a
    poll interval later. A server that logged its stop and exited in between took the link with it: its last lines
    were never read, so a clean stop read as a crash (no stop request: InferenceServerDown paged). Discovery holds
    the file from the moment it found the server, and the follower reads it to its end. Here in a /proc of the
    test's own making: the link, its `fdinfo` (open for writing), and the link gone as the process exits."""
    w, log, link = _found_by_its_stdout(tmp_path)
    [server] = w.servers()
    assert [s.path for s in server.launch.log_sources] == [str(log)]
    stop = transcripts.real("sglang-sigterm-group-stop.log").encode()
    append(log, stop)
    link.unlink()  # the process is gone, and its descriptors with it
    m = LogManager(w, poll_interval=1.0)
    m.poll()
    assert server.interpreter.snapshot().stop_requested
    assert stats(m).read_bytes == len(stop)
    m.close()
    assert _open(log) == 0


def test_a_followed_log_is_not_held_open_twice(tmp_path: Path) -> None:
    """Once its follower has opened the file itself, discovery's descriptor of it is closed: held on, it would keep
    a rotated, deleted log's blocks from being freed."""
    w, log, _ = _found_by_its_stdout(tmp_path)
    assert _open(log) == 1  # discovery's
    m = LogManager(w, poll_interval=1.0)
    m.poll()
    assert _open(log) == 1 and stats(m).up  # the follower's own
    m.close()
    assert _open(log) == 0


def _found_by_its_stdout(tmp_path: Path) -> tuple[Watcher, Path, Path]:
    """A watcher (whose log follower holds logs) that found this test's process writing a healthy SGLang launch to
    a file, its stdout as a `/proc/PID/fd/1` link and its `fdinfo` (open for writing) in a /proc of the test's own
    making: the watcher, the log, and the link."""
    proc = tmp_path / "proc" / str(os.getpid())
    (proc / "fd").mkdir(parents=True)
    (proc / "fdinfo").mkdir()
    log = tmp_path / "server.log"
    log.write_bytes(transcripts.sglang_healthy(1).encode())
    (proc / "fd" / "1").symlink_to(log)
    (proc / "fdinfo" / "1").write_text("pos:\t0\nflags:\t02102001\nmnt_id:\t25\n")
    w = watcher(tmp_path, [candidate(os.getpid())], hold_logs=True, paths=Paths(procfs=str(tmp_path / "proc")))
    w.refresh()
    return w, log, proc / "fd" / "1"


def _open(path: Path) -> int:
    """How many of this process's descriptors hold `path`."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path))


def test_a_file_growing_a_gib_a_second_reads_its_budget_and_skips_the_rest(tmp_path: Path) -> None:
    """A stdout file extended by 1 GiB a second (holes: no disk used) was read to its end, 9 GB in 30 s at most of a
    core (audit 2026-12-02 #14). A started manager reads at most its byte budget of it a second and counts the rest
    as skipped; the other server's line is read all the same."""
    flood, real = tmp_path / "flood.log", tmp_path / "real.log"
    flood.write_bytes(b"")
    real.write_bytes(b"")
    watcher = log_watcher({"flood": [flood], "real": [real]})
    limits = ReadLimits(bytes_per_second=4 << 20, max_backlog_bytes=16 << 20)
    manager = LogManager(watcher, poll_interval=0.1, read_limits=limits)
    began = time.monotonic()
    manager.start()
    try:
        poll(lambda: any(s.server == "flood" and s.up for s in manager.stats()), what="the flood file followed")
        size = 0
        for _ in range(10):  # as fast as the test can: faster than the audit's GiB a second
            size += 1 << 30
            os.truncate(flood, size)
        append(real, LAUNCH)
        real_server = next(s for s in watcher.servers() if s.name == "real")
        poll(lambda: real_server.interpreter.snapshot().phase == "launching", what="the real server's line")
        figures = poll(lambda: next((s for s in manager.stats() if s.server == "flood" and s.backlog == 0), None),
                       what="the flood caught up on")
    finally:
        manager.stop()
    elapsed = time.monotonic() - began
    assert figures.read_bytes <= limits.bytes_per_second * (elapsed + 1) + (1 << 20), figures
    assert figures.read_bytes + figures.skipped_bytes == size
