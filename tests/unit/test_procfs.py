"""stallwatch.procfs: a pid names a directory only when it is one, and a file of another process is read without
blocking, only when regular, never past its limit, whatever its reads return at a time."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from stallwatch import procfs


@pytest.mark.parametrize("pid", [0, -1, True, False, None, 1.5, "", "1", "../1", "1/fd", "self/..", "../self"])
def test_pid_dir_refuses_what_is_not_a_pid(pid: object) -> None:
    with pytest.raises(ValueError, match="not a pid"):
        procfs.pid_dir("/proc", pid)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a pid"):
        procfs.pid_path("/proc", pid, "stat")  # type: ignore[arg-type]


def test_pid_paths() -> None:
    assert procfs.pid_dir("/host/proc", 42) == "/host/proc/42"
    assert procfs.pid_dir("/proc", "self") == "/proc/self"
    assert procfs.pid_path("/proc", "thread-self", "ns", "net") == "/proc/thread-self/ns/net"
    assert procfs.pid_path("/proc", 7, "fd", "1") == "/proc/7/fd/1"


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "environ"
    os.mkfifo(fifo)
    result: list[BaseException] = []

    def read() -> None:
        try:
            procfs.read_bounded(str(fifo), 4096)
        except OSError as exc:
            result.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), "a FIFO with no writer blocked the read"
    assert len(result) == 1 and result[0].errno == errno.EINVAL


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OSError) as caught:
        procfs.read_bounded(str(tmp_path), 10)
    assert caught.value.errno in (errno.EINVAL, errno.EISDIR)


def test_a_symlink_is_refused_with_nofollow_and_followed_without(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"root only")
    link = tmp_path / "config.v2.json"
    link.symlink_to(target)
    with pytest.raises(OSError) as caught:
        procfs.read_bounded(str(link), 100, nofollow=True)
    assert caught.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        procfs.open_regular(str(link), nofollow=True)
    assert procfs.read_bounded(str(link), 100) == b"root only"


def test_the_limit_is_respected(tmp_path: Path) -> None:
    path = tmp_path / "cgroup"
    path.write_bytes(b"x" * 200_000)
    assert procfs.read_bounded(str(path), 100) == b"x" * 100
    assert len(procfs.read_bounded(str(path), 150_000)) == 150_000  # more than one read's chunk
    assert procfs.read_bounded(str(path), 1 << 20) == b"x" * 200_000
    assert procfs.read_bounded(str(path), 0) == b""


def test_short_reads_are_looped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """procfs hands out a page or a record at a time: every short read is followed by another until EOF or the cap."""
    path = tmp_path / "environ"
    path.write_bytes(b"A=1\0B=2\0C=3\0")
    real = os.read
    sizes: list[int] = []

    def short(fd: int, n: int) -> bytes:
        sizes.append(n)
        return real(fd, min(n, 3))

    monkeypatch.setattr(procfs.os, "read", short)
    assert procfs.read_bounded(str(path), 1000) == b"A=1\0B=2\0C=3\0"
    assert len(sizes) == 5  # four reads of 3 bytes, then the empty one at EOF
    sizes.clear()
    assert procfs.read_bounded(str(path), 7) == b"A=1\0B=2"
    assert sizes == [7, 4, 1]  # never asks past the cap


def test_descriptors_are_closed(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_bytes(b"1 (init) S 0")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        procfs.read_bounded(str(path), 100)
        with pytest.raises(OSError):
            procfs.read_bounded(str(fifo), 100)
    assert len(os.listdir("/proc/self/fd")) == before


def test_lines_streams_a_regular_file_and_refuses_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "tcp"
    path.write_bytes(b"  sl local\n   0: 00000000:1F40\n")
    assert list(procfs.lines(str(path))) == [b"  sl local\n", b"   0: 00000000:1F40\n"]
    fifo = tmp_path / "tcp6"
    os.mkfifo(fifo)
    with pytest.raises(OSError):
        list(procfs.lines(str(fifo)))


def test_open_namespace_of_our_own_process() -> None:
    fd = procfs.open_namespace("/proc", "self", "net")
    try:
        assert os.fstat(fd).st_ino == os.stat("/proc/self/ns/net").st_ino
    finally:
        os.close(fd)
    with pytest.raises(ValueError, match="not a pid"):
        procfs.open_namespace("/proc", "../1", "net")
