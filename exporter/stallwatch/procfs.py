"""Files of other processes: the one place one is named and opened.

Every path of a process comes from `pid_path`: a pid is a positive int (or `self`, `thread-self`), never text that
could climb out of `<procfs>/<pid>`. Every file another user can put there or name is opened by `open_regular`:
non-blocking (a FIFO planted under the name must not hang the exporter), a regular file or refused (checked on
the descriptor, before a byte is read), optionally without following a symlink (no late link swap). `read_bounded`
reads at most `limit` bytes of one, looping over short reads (procfs hands out a page at a time). Like
prometheus/procfs's `Proc.path` (`proc.go`) and `util.ReadFileNoStat` (`internal/util/readfile.go`).

The rules hold for the files found through a process too (a container's state under `--path.rootfs`, a log).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

__all__ = ["lines", "open_namespace", "open_regular", "pid_dir", "pid_path", "read_bounded", "read_fd"]

_SELF = ("self", "thread-self")
_CHUNK = 64 * 1024


def pid_dir(procfs: str, pid: int | str) -> str:
    """`<procfs>/<pid>`; ValueError unless `pid` is an int above 0, `"self"` or `"thread-self"`."""
    if isinstance(pid, bool) or not ((isinstance(pid, int) and pid > 0) or (isinstance(pid, str) and pid in _SELF)):
        raise ValueError(f"not a pid: {pid!r}")
    return os.path.join(procfs, str(pid))


def pid_path(procfs: str, pid: int | str, *parts: str) -> str:
    """`<procfs>/<pid>/<parts...>` (`parts` are the exporter's own names: `fd`, `1`); ValueError as `pid_dir`."""
    return os.path.join(pid_dir(procfs, pid), *parts)


def open_regular(path: str, nofollow: bool = False) -> int:
    """A read-only, non-blocking descriptor of the regular file at `path`; the caller closes it.

    OSError when it cannot be opened, EINVAL when it is no regular file (a FIFO, a directory, a device), ELOOP
    for a symlink with `nofollow`; ValueError for a path with a NUL."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd`, looping over short reads until end of file or the cap."""
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(_CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_bounded(path: str, limit: int, nofollow: bool = False) -> bytes:
    """At most `limit` bytes of the regular file at `path` (opened as `open_regular` does); raises as it does."""
    fd = open_regular(path, nofollow)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def lines(path: str) -> Iterator[bytes]:
    """The lines of the regular file at `path` (opened as `open_regular` does), streamed: for the kernel's own
    tables (`net/tcp`), which can be large but are no other user's text. Raises as `open_regular`, while iterated."""
    with os.fdopen(open_regular(path), "rb") as handle:
        yield from handle


def open_namespace(procfs: str, pid: int | str, kind: str) -> int:
    """A descriptor of `pid`'s namespace of `kind` (`net`, `mnt`), for ioctl(2) or setns(2); the caller closes it.
    Needs the ptrace-read check (fs/proc/namespaces.c); OSError when refused or gone, ValueError as `pid_dir`."""
    return os.open(pid_path(procfs, pid, "ns", kind), os.O_RDONLY | os.O_CLOEXEC)
