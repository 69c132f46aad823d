"""Following one log: a file (`LogFile`) or a unit's journal entries (`JournalLog`), read through the decoder of its
framing, complete lines handed to the server's interpreter, and its figures (bytes, lines, growth time) kept as a
`FileStats` replaced whole. A file survives rotation (rename or copytruncate), deletion, re-pointed symlinks, files
that appear late, binary bytes and endless lines; it is opened once (`open_log`), non-blocking and regular only,
through `stallwatch.procfs`. Not thread-safe: one thread polls a follower (`signals.logs.LogManager`), any thread
may read its `stats()`.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.logs.budget import ReadBudget
from stallwatch.logs.configured import open_configured
from stallwatch.logs.formats import Transcoder, decoder_for
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.journal import JournalReader
from stallwatch.logs.shared import WriterFilter
from stallwatch.logs.source import LogSource
from stallwatch.procfs import open_regular, read_bounded

__all__ = ["FileStats", "Follower", "HeldLogs", "JournalLog", "LogFile", "open_log"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
MAX_PARTIAL_BYTES = 1 << 20  # of an unfinished line kept for matching; the rest is counted, not kept
RECOVERY_BYTES = 64 << 20  # how far back from the end a restarted exporter looks for the last launch
FDINFO_READ_LIMIT = 4096  # `pos`, `flags`, `mnt_id`, `ino`: under a hundred bytes


@dataclass(frozen=True)
class FileStats:
    """A log's figures at one moment of its follower: published whole, never a mix of two polls."""

    server: str
    log: str  # its stable name (`LogSource.name`)
    path: str
    up: bool
    size: int | None
    read_bytes: int
    lines: int
    last_growth: float | None
    backlog: int = 0  # bytes of the file not read yet
    skipped_bytes: int = 0  # bytes left unread because the file grew faster than its read budget (`logs.budget`)
    shared: bool = False  # another watched server's log too: only lines its prefix says are this server's count


class Follower:
    """What every kind of log reports: readability, bytes and lines of the engine's output, when it last grew.

    The figures (`_up`, `_size`, `_read_bytes`, `_lines`, `_last_growth`) are the follower thread's own; other
    threads read `stats()`, a frozen `FileStats` replaced whole (one reference assignment) after each poll, when the
    log goes down, and before a replay."""

    def __init__(self, server: str, source: LogSource, interpreter: LogInterpreter) -> None:
        self.server, self.path, self.interpreter, self.source = server, source.path, interpreter, source
        self._error: str | None = None
        self._up = False
        self._size: int | None = None
        self._read_bytes = 0
        self._lines = 0
        self._last_growth: float | None = None
        self._backlog = 0
        self._skipped = 0
        self._shared_with: frozenset[str] = frozenset()
        self._stats = FileStats(server, source.name, self.path, False, None, 0, 0, None)

    def stats(self) -> FileStats:
        return self._stats

    def _publish(self) -> None:
        self._stats = FileStats(self.server, self.source.name, self.path, self._up, self._size, self._read_bytes,
                                self._lines, self._last_growth, self._backlog, self._skipped, bool(self._shared_with))

    def mark_down(self, exc: Exception) -> None:
        self._up = False
        message = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
        if message != self._error:
            log.warning("log %s of %s is not readable: %s", self.path, self.server, message)
            self._error = message
        self._publish()

    def mark_up(self) -> None:
        self._up = True
        if self._error is not None:
            log.info("log %s is readable again", self.path)
            self._error = None

    def retarget(self, source: LogSource, held: int | None = None) -> None:
        self.source = source
        _close(held)

    def poll(self, deadline: float | None = None) -> bool:
        """Read what is new, until `deadline` (monotonic) when given: whether some is left to read now (a file that
        has read its budget's share waits for a later pass: False). The figures are published when it returns or
        raises."""
        try:
            return self._poll(deadline)
        finally:
            self._publish()

    def _poll(self, deadline: float | None) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        pass


class JournalLog(Follower):
    """A server's journal entries (a systemd unit, or Docker's journald driver) since its launch. Entries from
    before the exporter started replay the phase without counting as events, as a recovered file does."""

    def __init__(self, server: str, source: LogSource, interpreter: LogInterpreter, since: float, started: float,
                 directory: str | None) -> None:
        super().__init__(server, source, interpreter)
        self._started = started
        self._reader = JournalReader(source.journal_match, since, directory=directory)

    def _poll(self, deadline: float | None) -> bool:
        """The reader's own byte budget bounds a call (`logs.journal`)."""
        entries = self._reader.read()
        if not self._reader.up and not entries:
            self.mark_down(OSError(errno.EIO, f"journalctl: {self._reader.error or 'not running'}"))
            return False
        self.mark_up()
        for new, group in itertools.groupby(entries, key=lambda entry: entry[0] >= self._started):
            block = [message for _, message in group]
            data = b"".join(block)
            if new:
                self._read_bytes += len(data)
                self._lines += len(block)
            self.interpreter.feed(data, count_events=new)
        if entries:
            self._last_growth = max(self._last_growth or 0.0, entries[-1][0])
            if self._last_growth < self._started:
                self.interpreter.recovered(self._last_growth)
        return False

    def close(self) -> None:
        self._reader.close()


@dataclass(frozen=True)
class _Replay:
    end: int  # where news begins: the size when the server was found (or the file opened); before it, replayed
    mtime: float


class LogFile(Follower):
    """One log file of a server, read from `source.open_path` as UTF-8 (`Transcoder`: a UTF-16 file transcoded)
    through the decoder of its format, so that the interpreter, bytes and lines see the engine's own output without
    the runtime's framing. A UTF-16 file's bytes count as the file's, as its size does."""

    def __init__(self, server: str, source: LogSource, interpreter: LogInterpreter,
                 wall: Callable[[], float] = time.time, recover: bool = True, recover_events: bool = False,
                 replayed: Callable[[tuple[int, int]], bool] = lambda ident: False,
                 news_from: int | None = None, held: int | None = None, budget: ReadBudget | None = None,
                 writers: WriterFilter | None = None) -> None:
        """`replayed(ident)`: whether another follower already replayed that (device, inode), which this one then
        reads from its end (the processes of several servers can share one stdout file). `news_from`: the file's
        size when its server was found; past it the first open reads news, not a replay, however late it comes.
        `held`: a descriptor of the file that discovery opened (`HeldLogs`), now this follower's: read when
        `open_path` is gone before the follower opened it (the process exited first), closed once it has. `budget`:
        how much of the file a poll may read (a started follower thread's; a one-shot reader reads it all).
        `writers`: the lines of the file that the server's own processes wrote, while it is `shared`."""
        super().__init__(server, source, interpreter)
        self._wall = wall
        self._decoder = decoder_for(source.format)
        self._text = Transcoder()
        self._recover = recover
        self._recover_events = recover_events
        self._replayed = replayed
        self._news_from = news_from
        self._replay: _Replay | None = None
        self._fd: int | None = None
        self._held = held
        self.ident: tuple[int, int] | None = None
        self._offset = 0
        self._seen = 0  # the size last seen: a larger one is growth, however far behind the reading is
        self._partial = bytearray()
        self._overlong = False
        self._budget = budget
        self._resync = False  # reading goes on mid-line after a skip: from the next line
        self._skipped_once = False
        self._writers = writers

    def identity(self) -> tuple[int, int] | None:
        """The (device, inode) at `open_path` now (what the next poll follows), else the one last followed (the
        process is gone and its `fd` link with it: its follower still reads that file); None for neither."""
        if self.source.unavailable:
            return None
        try:
            return _ident(os.stat(self.source.open_path))
        except (OSError, ValueError):
            return self.ident

    def share(self, others: frozenset[str]) -> None:
        """The other servers whose logs are this file too (the manager's, before each pass): while there are any,
        only the lines that the server's own processes wrote are its (`logs.shared`)."""
        if others and others != self._shared_with:
            log.warning("log %s of %s is also the log of %s: its lines count for a server only where their prefix "
                        "names its process", self.path, self.server, ", ".join(sorted(others)))
        elif self._shared_with and not others:
            log.info("log %s is %s's alone again", self.path, self.server)
        self._shared_with = others

    def retarget(self, source: LogSource, held: int | None = None) -> None:
        """The same log, now reached another way (a restarted process's `/proc/PID/fd` link), with that process's
        descriptor of it when discovery `held` one."""
        if source != self.source:
            self.source = source
            self._decoder = decoder_for(source.format)
        if held is not None:
            _close(self._held)
            self._held = held

    def _poll(self, deadline: float | None) -> bool:
        if self.source.unavailable:
            self.mark_down(OSError(errno.ENOTSUP, self.source.unavailable))
            return False
        try:
            st = os.stat(self.source.open_path)
        except OSError as exc:
            held, self._held = self._held, None
            if held is not None and _ident(kept := os.fstat(held)) != self.ident:
                # The process is gone and its `fd` link with it, but discovery held the file: its last lines.
                self._switch(kept, deadline, held)
                return self._read_or_down(deadline)
            _close(held)
            self.mark_down(exc)
            # Deleted, but the writer may still hold it open.
            return self._fd is not None and self._drain(self._fd, deadline)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the follower, a directory cannot be read
            self.mark_down(OSError(errno.EINVAL, "not a regular file"))
            return False
        if _ident(st) != self.ident:
            self._switch(st, deadline)
        return self._read_or_down(deadline)

    def _read_or_down(self, deadline: float | None) -> bool:
        """Read the open file on from the offset: whether some is left to read."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._offset:  # copytruncate: start over at the top
            self._offset = self._seen = 0
            self._replay = None
            self._partial.clear()
            self._overlong = False
            self._decoder.reset()
            self._text.reset()
        self._size = size
        self._note_size(size)
        try:
            if self._budget is not None and self._replay is None and self._budget.too_far_behind(size - self._offset):
                self._skip_to(self._fd, size)
            behind = self._read(self._fd, deadline)
        except OSError as exc:
            self.mark_down(exc)
            return False
        finally:
            self._backlog = max(0, size - self._offset)
        self.mark_up()
        return behind

    def _skip_to(self, fd: int, size: int) -> None:
        """Leave the bytes up to `size` unread, counted as skipped: the file grows faster than its budget reads it.
        Reading goes on from the next whole line."""
        skipped = size - self._offset
        self._skipped += skipped
        if not self._skipped_once:
            log.warning("log %s of %s grows faster than it is read: %d bytes skipped (counted in "
                        "stallwatch_log_skipped_bytes_total)", self.path, self.server, skipped)
            self._skipped_once = True
        self._offset = size
        self._partial.clear()
        self._overlong = False
        self._decoder.reset()
        self._text.reset()
        self._text.begin(os.pread(fd, 2, 0), size)
        tail = os.pread(fd, 2, max(0, size - 2))  # a line's end in UTF-8 or UTF-16 (LE `\n\0`, BE `\0\n`)
        self._resync = not (size == 0 or tail.endswith(b"\n") or tail == b"\n\x00")

    def _note_size(self, size: int) -> None:
        """The log grew when its size did, not when its bytes are read (which may come later)."""
        if size > self._seen:
            self._last_growth = self._wall()
        self._seen = size

    def _switch(self, st: os.stat_result, deadline: float | None = None, fd: int | None = None) -> None:
        """Follow the file now at `path` (opened here, or `fd`, already open); the previous one (rotated away) is
        read to its end first, or as far as the deadline allows (the rest is dropped with it)."""
        if self._fd is not None:
            self._drain(self._fd, deadline)
            self._flush_partial()
            with contextlib.suppress(OSError):  # what the deadline or the budget left of it is dropped: say so
                self._skipped += max(0, os.fstat(self._fd).st_size - self._offset)
            os.close(self._fd)
            self._fd = None
        if fd is None:
            fd = open_log(self.source)
            _close(self._held)  # not kept past the follower's own open: it would pin a rotated, deleted file
            self._held = None
        # Size and up before the replay: a scrape never sees what the file says without the file's own figures.
        size = self._size = os.fstat(fd).st_size
        self.mark_up()
        ident = _ident(st)
        replayed = self._recover and self._replayed(ident)  # asked before this follower holds it too
        self._fd, self.ident, self._offset, self._seen, self._replay = fd, ident, 0, 0, None
        self._partial.clear()
        self._overlong = False
        self._decoder.reset()
        self._text.reset()
        if self._recover:
            self._recover = False
            self._seen = size
            self._last_growth = st.st_mtime
            old = size if self._news_from is None else min(size, self._news_from)
            if replayed:
                self._offset = old
            else:
                self._offset = self._replay_start(fd, old)
                self._replay = _Replay(old, st.st_mtime)
            self._text.begin(os.pread(fd, 2, 0), self._offset)
        self._publish()  # before the replay is read (and fed to the interpreter) in `_read`

    def _replay_start(self, fd: int, size: int) -> int:
        """Where to replay an existing file from: the window (at most a chunk) that holds its last launch marker.
        Its events count only when the server was launched after the exporter started (found by discovery a
        little late); otherwise they are old news."""
        floor = max(0, size - RECOVERY_BYTES)
        end = size
        head = os.pread(fd, 2, 0)
        while end > floor:
            begin = max(floor, end - CHUNK_BYTES)
            window = os.pread(fd, end - begin + 4096, begin)  # overlap: a marker across two chunks
            text = Transcoder()
            text.begin(head, begin)
            if self.interpreter.has_launch(decoder_for(self.source.format).decode(text.decode(window))):
                return begin if begin == floor else begin + window.find(b"\n") + 1  # from a whole record
            end = begin
        return floor

    def _read(self, fd: int, deadline: float | None) -> bool:
        """Read on from the offset (what is left of the replay first) to the file's end, or until `deadline`:
        whether some is left to read."""
        while True:
            replay = self._replay
            if replay is not None and self._offset >= replay.end:
                self._end_replay(replay)
                replay = None
            if self._budget is not None and not self._budget.allows():
                return False  # this second's share is read: the rest waits for a later pass, not for this one
            want = CHUNK_BYTES if replay is None else min(CHUNK_BYTES, replay.end - self._offset)
            data = os.pread(fd, want, self._offset)
            if self._budget is not None:
                self._budget.spend(len(data))
            if not data:
                if replay is None:
                    return False
                self._end_replay(replay)  # truncated under the replay: the next poll starts over
                continue
            self._offset += len(data)
            utf8 = self._text.decode(data)
            transcoded = len(data) - len(utf8)
            if self._resync:
                utf8 = self._line_start(utf8)
            text = self._decoder.decode(utf8)
            if replay is None:  # the engine's bytes without the runtime's framing; a transcoded file's as the file's
                self._read_bytes += len(text) + transcoded
                self._lines += text.count(b"\n")
            self._consume(text, count=replay is None or self._recover_events)
            if deadline is not None and time.monotonic() >= deadline:
                return True

    def _line_start(self, utf8: bytes) -> bytes:
        """What follows the end of the line a skip landed in (the line's rest is skipped too)."""
        cut = utf8.find(b"\n")
        dropped = len(utf8) if cut < 0 else cut + 1
        self._skipped += dropped
        self._resync = cut < 0
        return utf8[dropped:]

    def _end_replay(self, replay: _Replay) -> None:
        self._flush_partial(count=self._recover_events)
        self.interpreter.recovered(replay.mtime)
        self._replay = None

    def _drain(self, fd: int, deadline: float | None) -> bool:
        """Read a file that is no longer at `path` on, as it still grows: whether some is left to read."""
        try:
            self._note_size(os.fstat(fd).st_size)
            return self._read(fd, deadline)
        except OSError as exc:
            self.mark_down(exc)
            return False

    def _consume(self, data: bytes, count: bool) -> None:
        """Hand complete lines (ended by \\n, or \\r for progress bars) to the interpreter; keep the rest."""
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut < 0:
            self._keep(data)
            return
        head = bytes(self._partial) + data[: cut + 1] if self._partial else data[: cut + 1]
        self._partial.clear()
        self._overlong = False
        self._feed(head, count)
        self._keep(data[cut + 1 :])

    def _keep(self, rest: bytes) -> None:
        room = MAX_PARTIAL_BYTES - len(self._partial)
        if len(rest) > room:
            if not self._overlong:
                log.debug("log %s: a line longer than %d bytes; matching its start only", self.path, room)
            self._overlong = True
            rest = rest[: max(room, 0)]
        self._partial += rest

    def _flush_partial(self, count: bool = True) -> None:
        if self._partial:
            self._feed(bytes(self._partial) + b"\n", count)
            self._partial.clear()

    def _feed(self, lines: bytes, count: bool) -> None:
        """Complete lines to the interpreter: of a shared file, those the server's own processes wrote."""
        if self._shared_with:
            lines = self._writers(lines) if self._writers is not None else b""
            if not lines:
                return
        self.interpreter.feed(lines, count_events=count)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _close(self._held)
        self._held = None


class HeldLogs:
    """Descriptors of a process's log files (its `fd` links: stdout, stderr) opened when it was found, each kept
    until its follower takes it. The follower opens its file on its own first poll, up to a poll interval later;
    a process that exits before then takes its `fd` link with it, and with this its last lines stay readable.
    Those never taken are closed with the object (the launch it belongs to)."""

    def __init__(self, sources: tuple[LogSource, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}
        for source in sources:
            if source.via == "fd" and source.open_path and source.open_path not in self._fds:
                try:
                    self._fds[source.open_path] = open_log(source)
                except (OSError, ValueError) as exc:  # gone, not a file now: the follower reports it
                    log.debug("log %s not held: %s", source.open_path, exc)

    def take(self, open_path: str) -> int | None:
        """The descriptor of `open_path`, handed over once: the caller closes it."""
        with self._lock:
            return self._fds.pop(open_path, None)

    def __del__(self) -> None:
        for fd in self._fds.values():
            _close(fd)


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


# include/uapi/asm-generic/fcntl.h: how a process holds a file, as `/proc/PID/fdinfo/N` prints `flags` (octal).
_O_ACCMODE, _O_RDONLY, _O_PATH = 0o3, 0o0, 0o10000000


def open_log(source: LogSource) -> int:
    """A read-only descriptor of the regular file `source` names, opened once, checked before any byte is read.

    Non-blocking: a FIFO swapped in after the follower's stat must not block it (fstat then refuses it). A `node`
    file is opened without following a symlink; a process's `fd` link only while that process holds the file
    open for writing, so that an `O_PATH` descriptor of a file its owner cannot read (`/etc/shadow`) is not
    re-opened by the exporter with root's rights. A configured file only as `logs.configured` allows."""
    if source.via == "path" and source.owners:
        return open_configured(source)
    fd = open_regular(source.open_path, nofollow=source.via == "node")
    try:
        if source.via == "fd":
            _check_writer(source.open_path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_writer(link: str, opened: os.stat_result) -> None:
    """Raise unless the process behind `<procfs>/PID/fd/N` holds what we opened, open for writing. Checked after
    our open: a descriptor swapped in before it shows here, one swapped after it is not what we opened."""
    fd_dir, number = os.path.split(link)
    info = read_bounded(os.path.join(os.path.dirname(fd_dir), "fdinfo", number), FDINFO_READ_LIMIT)
    fields = dict(line.partition(b":")[::2] for line in info.splitlines())
    flags = int(fields.get(b"flags", b"0").strip() or b"0", 8)
    if flags & _O_PATH or flags & _O_ACCMODE == _O_RDONLY:
        raise PermissionError(errno.EACCES, "the process does not hold it open for writing")
    now = os.stat(link)
    if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
        raise OSError(errno.EAGAIN, "the process's descriptor changed while it was opened")
