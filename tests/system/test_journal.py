"""Following a unit's journal through `journalctl` (a stand-in, and the real one where present)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stallwatch.logs import journal
from stallwatch.logs.journal import JournalReader
from support.clock import Clock
from support.harness import LOADED_MACHINE
from support.paths import SIM_BIN

FAKE = str(SIM_BIN / "journalctl")


UNIT = "sglang.service"


T0 = 1_764_400_000.0  # the server's launch


def entry(i: int, at: float, message: object = None, unit: str = UNIT, **fields: object) -> dict[str, object]:
    return {"__CURSOR": f"s=fake;i={i:x}", "__REALTIME_TIMESTAMP": str(round(at * 1e6)), "_SYSTEMD_UNIT": unit,
            "_PID": str(4000 + i % 3), "MESSAGE": f"line {i}" if message is None else message, **fields}


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_bytes(b"")

    def add(self, *entries: dict[str, object] | str) -> None:
        with open(self.path, "a") as f:
            for e in entries:
                f.write((e if isinstance(e, str) else json.dumps(e)) + "\n")


@pytest.fixture
def jrnl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Journal:
    path = tmp_path / "journal.jsonl"
    monkeypatch.setenv("STALLWATCH_FAKE_JOURNAL", str(path))
    return Journal(path)


@pytest.fixture
def reader() -> Iterator[Callable[..., JournalReader]]:
    made: list[JournalReader] = []

    def make(**kwargs: object) -> JournalReader:
        kwargs.setdefault("unit", UNIT)
        kwargs.setdefault("since", T0)
        kwargs.setdefault("journalctl", FAKE)
        r = JournalReader(**kwargs)  # type: ignore[arg-type]
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def collect(r: JournalReader, count: int, timeout: float = 5.0 * LOADED_MACHINE) -> list[tuple[float, bytes]]:
    got: list[tuple[float, bytes]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += r.read()
        time.sleep(0.02)
    return got


def until(condition: Callable[[], bool], timeout: float = 5.0 * LOADED_MACHINE) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_entries_since_launch_of_the_unit_only(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    jrnl.add(entry(1, T0 - 30, "previous run"), entry(2, T0 + 1, "launch"), entry(3, T0 + 2, "other", unit="x.service"),
             entry(4, T0 + 3, "worker"))
    r = reader()
    assert r.up and r.error is None
    assert r.command()[1:] == ["--follow", "--all", "--output=json", "--no-pager", f"--since=@{T0:.0f}",
                               f"_SYSTEMD_UNIT={UNIT}"]
    assert collect(r, 2) == [(T0 + 1, b"launch\n"), (T0 + 3, b"worker\n")]
    assert r.command()[-2] == "--after-cursor=s=fake;i=4"  # for a restart


def test_a_whole_match_selects_other_fields(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    """Docker's journald driver: entries of one container by CONTAINER_ID_FULL, not by unit."""
    cid = "ab" * 32
    jrnl.add(entry(1, T0 + 1, "in the container", unit="docker.service", CONTAINER_ID_FULL=cid),
             entry(2, T0 + 2, "docker itself", unit="docker.service"))
    r = reader(unit=f"CONTAINER_ID_FULL={cid}")
    assert r.command()[-1] == f"CONTAINER_ID_FULL={cid}"
    assert collect(r, 1) == [(T0 + 1, b"in the container\n")]
    assert collect(r, 1, timeout=0.3) == []


def test_follows_appended_entries(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    jrnl.add(entry(1, T0 + 1))
    r = reader()
    assert collect(r, 1) == [(T0 + 1, b"line 1\n")]
    jrnl.add(entry(2, T0 + 2), entry(3, T0 + 3, unit="x.service"), entry(4, T0 + 4))
    assert collect(r, 2) == [(T0 + 2, b"line 2\n"), (T0 + 4, b"line 4\n")]
    assert r.read() == []
    burst = range(5, 3005)  # ~600 KB at once: lines cut across pipe reads
    jrnl.add(*(entry(i, T0 + 4, f"burst {i} " + "b" * 100) for i in burst))
    assert [m for _, m in collect(r, len(burst))] == [b"burst %d %s\n" % (i, b"b" * 100) for i in burst]


def test_message_encodings(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    jrnl.add(
        entry(1, T0 + 1, "plain caf\u00e9"),
        entry(2, T0 + 2, list(b"bytes \xff\xfe not utf-8")),
        entry(3, T0 + 3, None) | {"MESSAGE": None},
        entry(4, T0 + 4, ["repeated", list(b"\xff")]),
        entry(5, T0 + 5, "ends with newline\n"),
        entry(6, T0 + 6, "lone \udc80 surrogate"),
        entry(7, T0 + 7, 42),  # not a MESSAGE journalctl prints: skipped
        {k: v for k, v in entry(8, T0 + 8).items() if k != "MESSAGE"},
        "not json at all",
        '{"unterminated": ',
        "[" * 100000,
        entry(9, T0 + 9, "after the garbage"),
    )
    r = reader()
    assert collect(r, 7) == [
        (T0 + 1, "plain caf\u00e9\n".encode()),
        (T0 + 2, b"bytes \xff\xfe not utf-8\n"),
        (T0 + 3, b"\n"),
        (T0 + 4, b"repeated\n\xff\n"),
        (T0 + 5, b"ends with newline\n"),
        (T0 + 6, b"lone \x80 surrogate\n"),
        (T0 + 9, b"after the garbage\n"),
    ]
    assert r.skipped == 5


def test_missing_journalctl_is_down_with_a_reason(tmp_path: Path, reader: Callable[..., JournalReader]) -> None:
    clock = Clock(1000.0)
    r = reader(journalctl=str(tmp_path / "no-such-journalctl"), clock=clock)
    assert not r.up and r.read() == []
    assert r.error is not None and "no-such-journalctl" in r.error and "No such file" in r.error


def test_unreadable_journal_directory_is_down_with_journalctls_words(
    jrnl: Journal, tmp_path: Path, reader: Callable[..., JournalReader]
) -> None:
    jrnl.add(entry(1, T0 + 1))
    ok = reader(directory=str(tmp_path))
    assert f"--directory={tmp_path}" in ok.command()
    assert collect(ok, 1) == [(T0 + 1, b"line 1\n")]
    bad = reader(directory=str(tmp_path / "missing"))
    assert until(lambda: bad.read() == [] and not bad.up)
    assert bad.error is not None and "status 1" in bad.error and "Failed to open" in bad.error


def test_killed_journalctl_restarts_after_the_last_cursor(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    jrnl.add(*(entry(i, T0 + i) for i in range(1, 6)))
    r = reader()
    got = collect(r, 5)
    first_pid = r.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGKILL)
    jrnl.add(*(entry(i, T0 + i) for i in range(6, 9)))
    assert until(lambda: not r.up)
    assert r.read() == []
    assert r.error is not None and "signal 9" in r.error
    down_at = time.monotonic()
    assert until(lambda: bool(r.read()) or r.up)
    assert time.monotonic() - down_at >= 0.9, "restarted without backoff"
    assert r.pid != first_pid and "--after-cursor=s=fake;i=5" in r.command()
    got += collect(r, 3)
    jrnl.add(entry(9, T0 + 9))
    got += collect(r, 1)
    assert [m for _, m in got] == [b"line %d\n" % i for i in range(1, 10)]


def test_backoff_doubles_up_to_a_minute_and_resets_after_a_stable_run(
    tmp_path: Path, jrnl: Journal, reader: Callable[..., JournalReader]
) -> None:
    starts = tmp_path / "starts"
    failing = tmp_path / "failing-journalctl"
    failing.write_text(f"#!/bin/sh\necho x >> {starts}\necho 'Failed to open journal: Permission denied' >&2\nexit 1\n")
    failing.chmod(0o755)
    clock = Clock(1000.0)
    r = reader(journalctl=str(failing), clock=clock)

    def settle() -> None:  # let the started process exit and be reaped, without the clock moving
        assert until(lambda: r.read() == [] and not r.up and r.pid is None)

    settle()
    assert r.error == f"{failing} exited with status 1: Failed to open journal: Permission denied"
    start = clock.now
    waits = []
    for _ in range(9):
        count = len(starts.read_text().split())
        while len(starts.read_text().split()) == count:
            clock.now += 0.25
            r.read()
            assert until(lambda: r.pid is None or not r.up)
        settle()
        waits.append(clock.now - start)
        start = clock.now
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    shutil.copy(FAKE, failing)  # now it works and keeps running
    clock.now += 60
    assert r.read() == [] and r.up
    clock.now += journal.STABLE_SECONDS
    os.kill(r.pid or 0, signal.SIGKILL)
    assert until(lambda: r.read() == [] and not r.up)
    restarted_at = clock.now
    while not r.up:
        clock.now += 0.25
        r.read()
    assert clock.now - restarted_at == 1


def test_stale_cursor_falls_back_to_the_last_entry_time(
    jrnl: Journal, reader: Callable[..., JournalReader]
) -> None:
    jrnl.add(*(entry(i, T0 + i) for i in range(1, 4)))
    clock = Clock(1000.0)
    r = reader(clock=clock)
    got = collect(r, 3)
    jrnl.path.write_bytes(b"")  # vacuumed: the cursor is gone, entries 2-3 remain, new ones follow
    jrnl.add(*(entry(i, T0 + i) | {"__CURSOR": f"s=rewritten;i={i:x}"} for i in range(2, 6)))
    os.kill(r.pid or 0, signal.SIGKILL)
    assert until(lambda: r.read() == [] and not r.up)
    clock.now += 1
    assert until(lambda: r.read() == [] and not r.up and r.pid is None)
    assert r.error is not None and "Failed to seek to cursor" in r.error
    assert r.command()[-2] == f"--since=@{T0 + 3:.0f}"
    clock.now += 2
    got += collect(r, 2)
    assert [m for _, m in got] == [b"line %d\n" % i for i in range(1, 6)]


def test_stderr_flood_does_not_block_nor_pile_up(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    jrnl.add(json.dumps({"__FAKE_STDERR__": "Hint: noisy warning " + "w" * 200, "repeat": 40000}),
             json.dumps({"__FAKE_STDERR__": "last warning"}), entry(1, T0 + 1))
    tracemalloc.start()
    try:
        r = reader()
        got = collect(r, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == [(T0 + 1, b"line 1\n")]
    assert r.up and r.error == "last warning"
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB for 9 MB of stderr"


def test_endless_output_line_is_skipped_with_memory_bounded(
    jrnl: Journal, reader: Callable[..., JournalReader], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal, "MAX_LINE_BYTES", 64 << 10)
    jrnl.add(entry(1, T0 + 1, "x" * (1 << 20)), entry(2, T0 + 2))
    r = reader()
    assert collect(r, 1) == [(T0 + 2, b"line 2\n")]
    assert r.skipped == 1


def test_close_kills_and_reaps(jrnl: Journal, reader: Callable[..., JournalReader]) -> None:
    r = reader()
    pid = r.pid
    assert pid is not None and r.up
    r.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not r.up and r.read() == [] and r.pid is None and r.error == "closed"
    r.close()


def test_stand_in_refuses_unknown_flags(jrnl: Journal) -> None:
    done = subprocess.run([FAKE, "--follow", "--bogus"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "unrecognized option '--bogus'" in done.stderr
    done = subprocess.run([FAKE, "--since=@1", "--after-cursor=x"], capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "only one of" in done.stderr


def test_stand_in_exits_when_its_reader_is_gone(jrnl: Journal) -> None:
    """As `journalctl -f` does, so an exporter that dies without close() leaves no follower behind."""
    proc = subprocess.Popen([FAKE, "--follow"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        proc.stdout.close()
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_real_journalctl_accepts_the_flags(tmp_path: Path, reader: Callable[..., JournalReader]) -> None:
    real = shutil.which("journalctl", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if real is None:
        pytest.skip("journalctl (systemd) is not installed")
    r = reader(journalctl=real, directory=str(tmp_path))  # an empty journal: it follows or gives up, either way
    until(lambda: r.read() == [] and not r.up, timeout=1.0)
    for refusal in ("unrecognized option", "Please specify", "requires an argument", "Failed to add match"):
        assert refusal not in (r.error or ""), r.error
