"""Following log files: bytes, lines and growth time per file, and complete lines handed to the server's
phase interpreter. Survives rotation (rename or copytruncate), deletion, re-pointed symlinks, files that appear
late, binary bytes and endless lines. inotify (watchdog) wakes the follower at once; polling is the floor,
so network filesystems without events still work."""

from __future__ import annotations

import errno
import glob
import itertools
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import LOOP_INTERVAL
from stallwatch.discovery.watcher import Watcher
from stallwatch.logs.formats import decoder_for
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.journal import JournalReader
from stallwatch.logs.source import LogSource
from stallwatch.loops import run_every

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
MAX_PARTIAL_BYTES = 1 << 20  # of an unfinished line kept for matching; the rest is counted, not kept
RECOVERY_BYTES = 64 << 20  # how far back from the end a restarted exporter looks for the last launch
# Of reading and matching per file and pass of a started follower, so that one file (a flood, a hostile one)
# cannot starve the others: a file left behind gets its next turn in the next pass, which comes at once.
READ_BUDGET_SECONDS = 0.05
MIN_POLL_GAP = 0.05


@dataclass(frozen=True)
class LogsSettings(CollectorSettings):
    """The `logs:` section."""

    poll_interval: float = setting(LOOP_INTERVAL, 1.0)  # the floor under inotify wake-ups


@dataclass(frozen=True)
class FileStats:
    server: str
    path: str
    up: bool
    size: int | None
    read_bytes: int
    lines: int
    last_growth: float | None


class _Log:
    """What every kind of log reports: readability, bytes and lines of the engine's output, when it last grew."""

    def __init__(self, server: str, source: LogSource, interpreter: LogInterpreter) -> None:
        self.server, self.path, self.interpreter, self.source = server, source.path, interpreter, source
        self._error: str | None = None
        self.up = False
        self.size: int | None = None
        self.read_bytes = 0
        self.lines = 0
        self.last_growth: float | None = None

    def stats(self) -> FileStats:
        return FileStats(self.server, self.path, self.up, self.size, self.read_bytes, self.lines, self.last_growth)

    def mark_down(self, exc: Exception) -> None:
        self.up = False
        message = f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}"
        if message != self._error:
            log.warning("log %s of %s is not readable: %s", self.path, self.server, message)
            self._error = message

    def mark_up(self) -> None:
        self.up = True
        if self._error is not None:
            log.info("log %s is readable again", self.path)
            self._error = None

    def retarget(self, source: LogSource) -> None:
        self.source = source

    def poll(self, deadline: float | None = None) -> bool:
        """Read what is new, until `deadline` (monotonic) when given: whether some is left to read."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class JournalLog(_Log):
    """A server's journal entries (a systemd unit, or Docker's journald driver) since its launch. Entries from
    before the exporter started replay the phase without counting as events, as a recovered file does."""

    def __init__(self, server: str, source: LogSource, interpreter: LogInterpreter, since: float, started: float,
                 directory: str | None) -> None:
        super().__init__(server, source, interpreter)
        self._started = started
        self._reader = JournalReader(source.journal_match, since, directory=directory)

    def poll(self, deadline: float | None = None) -> bool:
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
                self.read_bytes += len(data)
                self.lines += len(block)
            self.interpreter.feed(data, count_events=new)
        if entries:
            self.last_growth = max(self.last_growth or 0.0, entries[-1][0])
            if self.last_growth < self._started:
                self.interpreter.recovered(self.last_growth)
        return False

    def close(self) -> None:
        self._reader.close()


@dataclass(frozen=True)
class _Replay:
    end: int  # the file's size when it was opened: what lies before is old news, replayed
    mtime: float


class LogFile(_Log):
    """One log file of a server, read from `source.open_path` through the decoder of its format, so that the
    interpreter, bytes and lines see the engine's own output without the runtime's framing."""

    def __init__(self, server: str, source: LogSource, interpreter: LogInterpreter,
                 wall: Callable[[], float] = time.time, recover: bool = True, recover_events: bool = False,
                 replayed: Callable[[tuple[int, int]], bool] = lambda ident: False) -> None:
        """`replayed(ident)`: whether another follower already replayed that (device, inode), which this one then
        reads from its end (the processes of several servers can share one stdout file)."""
        super().__init__(server, source, interpreter)
        self._wall = wall
        self._decoder = decoder_for(source.format)
        self._recover = recover
        self._recover_events = recover_events
        self._replayed = replayed
        self._replay: _Replay | None = None
        self._fd: int | None = None
        self.ident: tuple[int, int] | None = None
        self._offset = 0
        self._seen = 0  # the size last seen: a larger one is growth, however far behind the reading is
        self._partial = bytearray()
        self._overlong = False

    def retarget(self, source: LogSource) -> None:
        """The same log, now reached another way (a restarted process's `/proc/PID/fd` link)."""
        if source != self.source:
            self.source = source
            self._decoder = decoder_for(source.format)

    def poll(self, deadline: float | None = None) -> bool:
        if self.source.unavailable:
            self.mark_down(OSError(errno.ENOTSUP, self.source.unavailable))
            return False
        try:
            st = os.stat(self.source.open_path)
        except OSError as exc:
            self.mark_down(exc)
            # Deleted, but the writer may still hold it open.
            return self._fd is not None and self._drain(self._fd, deadline)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the follower, a directory cannot be read
            self.mark_down(OSError(errno.EINVAL, "not a regular file"))
            return False
        if (st.st_dev, st.st_ino) != self.ident:
            self._switch(st, deadline)
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size < self._offset:  # copytruncate: start over at the top
            self._offset = self._seen = 0
            self._replay = None
            self._partial.clear()
            self._overlong = False
            self._decoder.reset()
        self.size = size
        self._note_size(size)
        try:
            behind = self._read(self._fd, deadline)
        except OSError as exc:
            self.mark_down(exc)
            return False
        self.mark_up()
        return behind

    def _note_size(self, size: int) -> None:
        """The log grew when its size did, not when its bytes are read (which may come later)."""
        if size > self._seen:
            self.last_growth = self._wall()
        self._seen = size

    def _switch(self, st: os.stat_result, deadline: float | None = None) -> None:
        """Open the file now at `path`; the previous one (rotated away) is read to its end first, or as far as
        the deadline allows (the rest is dropped with it)."""
        if self._fd is not None:
            self._drain(self._fd, deadline)
            self._flush_partial()
            os.close(self._fd)
            self._fd = None
        fd = open_log(self.source)
        # Size and up before the replay: a scrape never sees what the file says without the file's own figures.
        size = self.size = os.fstat(fd).st_size
        self.mark_up()
        ident = (st.st_dev, st.st_ino)
        replayed = self._recover and self._replayed(ident)  # asked before this follower holds it too
        self._fd, self.ident, self._offset, self._seen, self._replay = fd, ident, 0, 0, None
        self._partial.clear()
        self._overlong = False
        self._decoder.reset()
        if self._recover:
            self._recover = False
            self._seen = size
            self.last_growth = st.st_mtime
            if replayed:
                self._offset = size
            else:
                self._offset = self._replay_start(fd, size)
                self._replay = _Replay(size, st.st_mtime)

    def _replay_start(self, fd: int, size: int) -> int:
        """Where to replay an existing file from: the window (at most a chunk) that holds its last launch marker.
        Its events count only when the server was launched after the exporter started (found by discovery a
        little late); otherwise they are old news."""
        floor = max(0, size - RECOVERY_BYTES)
        end = size
        while end > floor:
            begin = max(floor, end - CHUNK_BYTES)
            window = os.pread(fd, end - begin + 4096, begin)  # overlap: a marker across two chunks
            if self.interpreter.has_launch(decoder_for(self.source.format).decode(window)):
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
            want = CHUNK_BYTES if replay is None else min(CHUNK_BYTES, replay.end - self._offset)
            data = os.pread(fd, want, self._offset)
            if not data:
                if replay is None:
                    return False
                self._end_replay(replay)  # truncated under the replay: the next poll starts over
                continue
            self._offset += len(data)
            text = self._decoder.decode(data)
            if replay is None:
                self.read_bytes += len(text)
                self.lines += text.count(b"\n")
            self._consume(text, count=replay is None or self._recover_events)
            if deadline is not None and time.monotonic() >= deadline:
                return True

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
        self.interpreter.feed(head, count_events=count)
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
            self.interpreter.feed(bytes(self._partial) + b"\n", count_events=count)
            self._partial.clear()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# include/uapi/asm-generic/fcntl.h: how a process holds a file, as `/proc/PID/fdinfo/N` prints `flags` (octal).
_O_ACCMODE, _O_RDONLY, _O_PATH = 0o3, 0o0, 0o10000000


def open_log(source: LogSource) -> int:
    """A read-only descriptor of the regular file `source` names, opened once, checked before any byte is read.

    Non-blocking: a FIFO swapped in after the follower's stat must not block it (fstat then refuses it). A `node`
    file is opened without following a symlink; a process's `fd` link only while that process holds the file
    open for writing, so that an `O_PATH` descriptor of a file its owner cannot read (`/etc/shadow`) is not
    re-opened by the exporter with root's rights."""
    nofollow = os.O_NOFOLLOW if source.via == "node" else 0
    fd = os.open(source.open_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if source.via == "fd":
            _check_writer(source.open_path, st)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_writer(link: str, opened: os.stat_result) -> None:
    """Raise unless the process behind `<procfs>/PID/fd/N` holds what we opened, open for writing. Checked after
    our open: a descriptor swapped in before it shows here, one swapped after it is not what we opened."""
    fd_dir, number = os.path.split(link)
    with open(os.path.join(os.path.dirname(fd_dir), "fdinfo", number), "rb") as info:
        fields = dict(line.partition(b":")[::2] for line in info.read(4096).splitlines())
    flags = int(fields.get(b"flags", b"0").strip() or b"0", 8)
    if flags & _O_PATH or flags & _O_ACCMODE == _O_RDONLY:
        raise PermissionError(errno.EACCES, "the process does not hold it open for writing")
    now = os.stat(link)
    if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
        raise OSError(errno.EAGAIN, "the process's descriptor changed while it was opened")


class _Wake(FileSystemEventHandler):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.event.set()


class LogManager:
    """Follows every watched server's log files from one thread, woken by inotify or the poll interval."""

    def __init__(self, watcher: Watcher, poll_interval: float, wall: Callable[[], float] = time.time,
                 stale_after: float | None = None, replay_events: bool = False) -> None:
        """`replay_events`: count the events of a recovered file's replay (from its last launch) too, as a one-shot
        reader (`stallwatch diagnose`) wants the events of the current launch."""
        self.watcher = watcher
        self._replay_events = replay_events
        self.poll_interval = poll_interval
        self._wall = wall
        self._budget: float | None = None  # per file and pass; set by `start`: a one-shot reader reads it all
        # A pass takes milliseconds (reads are budgeted per file): one this late means the loop is stuck.
        self.stale_after = stale_after if stale_after is not None else max(60.0, 10 * poll_interval)
        self._thread: threading.Thread | None = None
        self._heartbeat = time.monotonic()  # when the loop last finished a pass
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], _Log] = {}
        self._started = wall()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._observer: Observer | None = None
        self._watched: dict[str, object] = {}

    def stats(self) -> list[FileStats]:
        with self._lock:
            return [f.stats() for f in self._files.values()]

    def check(self) -> None:
        """Raise when the follower loop has died or has not finished a pass for `stale_after` seconds, so that
        the logs collector fails (`collector_success 0`) instead of exporting frozen figures as fresh."""
        if self._thread is None or self._stop.is_set():
            return
        if not self._thread.is_alive():
            raise RuntimeError("the log follower thread has ended")
        age = time.monotonic() - self._heartbeat
        if age > self.stale_after:
            raise RuntimeError(f"the log follower has not finished a pass for {age:.0f}s")

    def poll(self) -> bool:
        """One pass over every watched server's logs: whether some file was left with more to read."""
        servers = self.watcher.servers()
        wanted = {(s.name, source.path): (s, source) for s in servers for source in _expand(s.launch.log_sources)}
        with self._lock:
            for key in set(self._files) - set(wanted):
                self._files.pop(key).close()
            for key, (server, source) in wanted.items():
                if key in self._files:
                    self._files[key].retarget(source)
                    continue
                process = server.launch.key
                launch = process.create_time if process is not None else self._wall()
                if source.format == "journal":
                    self._files[key] = JournalLog(server.name, source, server.interpreter, launch, self._started,
                                                  self.watcher.config.paths.journal)
                    continue
                # Replayed lines are new events only when the process started after us; psutil's create_time
                # rests on a boot time in whole seconds: allow for that.
                launched_since = self._replay_events or (process is not None and launch >= self._started - 2.0)
                self._files[key] = LogFile(server.name, source, server.interpreter, self._wall,
                                           recover=os.path.exists(source.open_path), recover_events=launched_since,
                                           replayed=self._followed)
            files = list(self._files.values())
        behind = False
        for f in files:
            deadline = None if self._budget is None else time.monotonic() + self._budget
            try:
                behind = f.poll(deadline) or behind
            except Exception as exc:  # whatever one file does (OSError, a NUL in its path) is that file's log_up 0
                f.mark_down(exc)
        # The configured paths' directories too: a file that does not exist yet wakes us when it appears.
        procfs = self.watcher.config.paths.procfs
        self._watch({os.path.dirname(os.path.abspath(source.open_path)) for s in servers
                     for source in s.launch.log_sources
                     if source.open_path and not source.open_path.startswith(procfs)})
        return behind

    def _followed(self, ident: tuple[int, int]) -> bool:
        """Whether a file followed now is that (device, inode): its replay was the one there is."""
        with self._lock:
            return any(isinstance(f, LogFile) and f.ident == ident for f in self._files.values())

    def close(self) -> None:
        """Close every file (a one-shot reader that never started the loop)."""
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()

    def _watch(self, directories: set[str]) -> None:
        if self._observer is None:
            return
        for directory in directories - set(self._watched):
            try:
                self._watched[directory] = self._observer.schedule(_Wake(self._wake), directory, recursive=False)
            except (OSError, ValueError) as exc:  # missing directory, inotify limits, a NUL: polling covers it
                log.debug("no inotify watch on %s: %s", directory, exc)
                self._watched[directory] = None
        for directory in set(self._watched) - directories:
            watch = self._watched.pop(directory)
            if watch is not None:
                self._observer.unschedule(watch)

    def start(self) -> None:
        try:
            observer = Observer()
            observer.daemon = True
            observer.start()
            self._observer = observer
        except OSError as exc:
            log.warning("inotify unavailable (%s); polling logs every %.1fs", exc, self.poll_interval)
        self._heartbeat = time.monotonic()
        self._budget = READ_BUDGET_SECONDS  # one thread for every file now
        self._thread = run_every(self.poll_interval, self._pass, "log follower", self._stop, wake=self._wake,
                                 settle=MIN_POLL_GAP)  # one read for a burst of inotify events

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._observer is not None:
            self._observer.stop()

    def _pass(self) -> None:
        """Passes until no file is left behind (each has its budget in turn), not one per wake-up: a backlog is
        caught up on at once."""
        behind = True
        while behind and not self._stop.is_set():
            behind = self.poll()
            self._heartbeat = time.monotonic()


def _expand(sources: tuple[LogSource, ...]) -> list[LogSource]:
    """Configured globs become one source per matching file."""
    out: list[LogSource] = []
    for source in sources:
        if source.format == "plain" and glob.has_magic(source.open_path):
            out += [LogSource(p, p) for p in sorted(glob.glob(source.open_path))]
        else:
            out.append(source)
    return list({s.path: s for s in out}.values())
