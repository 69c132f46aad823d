"""Following every watched server's logs from one thread: a follower per log (`logs.follow`), made and dropped as
the watcher's servers and their log sources change, configured globs expanded. inotify (watchdog) wakes the thread
at once; polling is the floor, so network filesystems without events still work. Each file has a read budget per
pass, so that one (a flood, a hostile one) cannot starve the others, and a byte budget per second (`logs.budget`), so
that one that grows faster than it can be read costs a bounded share of the thread, its backlog skipped."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from stallwatch.config import CollectorSettings
from stallwatch.config.reader import setting
from stallwatch.config.values import LOOP_INTERVAL
from stallwatch.discovery.server import Server
from stallwatch.discovery.watcher import Watcher
from stallwatch.logs.budget import READ_LIMITS, ReadBudget, ReadLimits
from stallwatch.logs.configured import expand, owners_for
from stallwatch.logs.follow import FileStats, Follower, JournalLog, LogFile
from stallwatch.logs.shared import WriterFilter
from stallwatch.logs.source import named
from stallwatch.loops import run_every

log = logging.getLogger(__name__)

# Of reading and matching per file and pass of a started follower, so that one file (a flood, a hostile one)
# cannot starve the others: a file left behind gets its next turn in the next pass, which comes at once.
READ_BUDGET_SECONDS = 0.05
MIN_POLL_GAP = 0.05


@dataclass(frozen=True)
class LogsSettings(CollectorSettings):
    """The `logs:` section."""

    poll_interval: float = setting(LOOP_INTERVAL, 1.0)  # the floor under inotify wake-ups


class _Wake(FileSystemEventHandler):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self.event.set()


class LogManager:
    """Follows every watched server's log files from one thread, woken by inotify or the poll interval."""

    def __init__(self, watcher: Watcher, poll_interval: float, wall: Callable[[], float] = time.time,
                 stale_after: float | None = None, replay_events: bool = False,
                 read_limits: ReadLimits = READ_LIMITS) -> None:
        """`replay_events`: count the events of a recovered file's replay (from its last launch) too, as a one-shot
        reader (`stallwatch diagnose`) wants the events of the current launch. `read_limits`: each file's byte
        budget once started (a one-shot reader reads it all)."""
        self.watcher = watcher
        self._read_limits = read_limits
        self._replay_events = replay_events
        self.poll_interval = poll_interval
        self._wall = wall
        self._budget: float | None = None  # per file and pass; set by `start`: a one-shot reader reads it all
        # A pass takes milliseconds (reads are budgeted per file): one this late means the loop is stuck.
        self.stale_after = stale_after if stale_after is not None else max(60.0, 10 * poll_interval)
        self._thread: threading.Thread | None = None
        self._heartbeat = time.monotonic()  # when the loop last finished a pass
        self._lock = threading.Lock()
        self._files: dict[tuple[str, str], Follower] = {}
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
        wanted = {(s.name, source.path): (s, source) for s in servers
                  for source in named(expand(s.launch.log_sources, owners_for(s.launch.uid)))}
        with self._lock:
            for key in set(self._files) - set(wanted):
                self._files.pop(key).close()
            for key, (server, source) in wanted.items():
                held = server.launch.held_logs.take(source.open_path)
                if key in self._files:
                    self._files[key].retarget(source, held)
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
                                           recover=held is not None or os.path.exists(source.open_path),
                                           recover_events=launched_since,
                                           replayed=self._followed,
                                           news_from=dict(server.launch.log_sizes).get(source.open_path),
                                           held=held,
                                           budget=None if self._budget is None else ReadBudget(self._read_limits),
                                           writers=WriterFilter(server.engine.line_pid, _tree_pids(server)))
            files = list(self._files.values())
        _mark_shared(files)
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
            observer.name, observer.daemon = "log inotify", True
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


def _tree_pids(server: Server) -> Callable[[], list[int]]:
    return lambda: [s.pid for s in server.look().tree]


def _mark_shared(files: list[Follower]) -> None:
    """Tell each file that is another server's log too (one (device, inode) followed for several servers: their
    processes' stdout appended to one file) which servers those are, before it is read (audit 2026-12-02 #6)."""
    readers: dict[tuple[int, int], set[str]] = {}
    idents = [(f, f.identity()) for f in files if isinstance(f, LogFile)]
    for f, ident in idents:
        if ident is not None:
            readers.setdefault(ident, set()).add(f.server)
    for f, ident in idents:
        f.share(frozenset(readers.get(ident, set()) - {f.server}) if ident is not None else frozenset())
