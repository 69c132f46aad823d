"""A log file that grows faster than it can be read (audit 2026-12-02 #14: a stdout file extended by 1 GiB a second
cost most of a core) reads at most its byte budget a second and skips a backlog past its limit, counting what it
skipped, and reads on from the next whole line."""

from __future__ import annotations

from pathlib import Path

from stallwatch.collectors.logs import LogsCollector
from stallwatch.logs.budget import ReadBudget, ReadLimits
from stallwatch.logs.follow import CHUNK_BYTES, LogFile
from support.clock import Clock
from support.watchers import log_watcher

MIB = 1 << 20
LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"


def _follower(path: Path, clock: Clock, limits: ReadLimits) -> tuple[LogFile, object]:
    server = log_watcher({"s": [path]}).servers()[0]
    follower = LogFile(server.name, server.launch.log_sources[0], server.interpreter, wall=clock, recover=False,
                       budget=ReadBudget(limits, clock))
    return follower, server


def test_a_file_reads_at_most_its_budget_a_second(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    follower, _ = _follower(path, clock, ReadLimits(bytes_per_second=2 * MIB, max_backlog_bytes=64 * MIB))
    path.write_bytes(b"x" * (5 * MIB - 1) + b"\n")
    assert not follower.poll()  # its second's share read: not "behind", so the pass does not spin on it
    assert follower.stats().read_bytes == 2 * CHUNK_BYTES and follower.stats().backlog == 3 * MIB
    assert not follower.poll()  # no time has passed: nothing more
    assert follower.stats().read_bytes == 2 * MIB
    clock.now += 1.0
    follower.poll()
    assert follower.stats().read_bytes == 4 * MIB and follower.stats().backlog == MIB
    assert follower.stats().skipped_bytes == 0


def test_a_backlog_past_its_limit_is_skipped_and_counted_and_the_next_whole_line_read(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    follower, server = _follower(path, clock, ReadLimits(bytes_per_second=MIB, max_backlog_bytes=4 * MIB))
    with open(path, "wb") as f:
        f.truncate(10 * MIB + 5)  # holes, as the audit's ftruncate: the file ends in the middle of a "line"
    follower.poll()
    stats = follower.stats()
    assert stats.skipped_bytes == 10 * MIB + 5 and stats.read_bytes == 0 and stats.backlog == 0
    with open(path, "ab") as f:
        f.write(b"rest of the zeros' line\n" + LAUNCH)
    clock.now += 1.0
    follower.poll()
    stats = follower.stats()
    assert stats.skipped_bytes == 10 * MIB + 5 + len(b"rest of the zeros' line\n")
    assert stats.read_bytes == len(LAUNCH) and stats.lines == 1
    assert server.interpreter.snapshot().phase == "launching"  # the whole line after the skip is read


def test_a_skip_that_ends_on_a_line_end_reads_the_next_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    follower, server = _follower(path, clock, ReadLimits(bytes_per_second=MIB, max_backlog_bytes=MIB))
    path.write_bytes(b"y" * (2 * MIB - 1) + b"\n")
    follower.poll()
    with open(path, "ab") as f:
        f.write(LAUNCH)
    follower.poll()
    assert follower.stats().skipped_bytes == 2 * MIB
    assert server.interpreter.snapshot().phase == "launching"


def test_the_collector_exports_the_backlog_and_the_skipped_bytes(tmp_path: Path) -> None:
    class Manager:
        def check(self) -> None:
            pass

        def stats(self) -> list:
            return [follower.stats()]

    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    follower, _ = _follower(path, clock, ReadLimits(bytes_per_second=MIB, max_backlog_bytes=2 * MIB))
    line = b"z" * (MIB - 1) + b"\n"
    path.write_bytes(line * 3)
    follower.poll()  # 3 MiB behind: skipped
    with open(path, "ab") as f:
        f.write(line * 2)
    follower.poll()  # 2 MiB behind: 1 MiB read, 1 MiB left
    families = {f.name: f for f in LogsCollector(Manager(), log_watcher({}), wall=clock).collect()}  # type: ignore
    labels = {"server": "s", "log": "file"}
    assert [s.labels for s in families["stallwatch_log_info"].samples] == [{**labels, "path": str(path)}]
    assert [(s.labels, s.value) for s in families["stallwatch_log_skipped_bytes"].samples
            if s.name.endswith("_total")] == [(labels, 3 * MIB)]
    assert [(s.labels, s.value) for s in families["stallwatch_log_backlog_bytes"].samples] == [(labels, MIB)]


def test_what_a_rotated_file_had_left_unread_when_its_budget_ran_out_counts_as_skipped(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    follower, _ = _follower(path, clock, ReadLimits(bytes_per_second=MIB, max_backlog_bytes=64 * MIB))
    follower.poll()
    path.write_bytes(b"w" * (3 * MIB - 1) + b"\n")
    follower.poll()  # 1 MiB read, 2 MiB left
    path.rename(tmp_path / "server.log.1")
    path.write_bytes(LAUNCH)
    follower.poll()  # the budget spent: the old file's rest is dropped with it
    stats = follower.stats()
    assert stats.read_bytes == MIB and stats.skipped_bytes == 2 * MIB
