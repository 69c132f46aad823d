"""What one server's log says, with its process and probes: the startup phase, notable events, the last line
that was progress, and the figures of the engine's stats lines.

Log blocks are scanned with the engine's prefilter (`logs.prefilter`). Once a server is serving, only launch,
failure and event rules stay in it: a busy server's `Decode batch` lines then cost one scan.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from stallwatch.engines.base import EVENTS, Engine, Figures, Rule
from stallwatch.logs.formats import ANSI
from stallwatch.logs.prefilter import SHARDS, compile_rules, line_bounds, strip_groups
from stallwatch.logs.stats_lines import StatsLineIntegrator

# Lines of one block that the prefilter picks, at most: each costs microseconds in Python, and a log of nothing
# but notable lines (a hostile file, a flood of tracebacks) must not hold the log thread. Those past it in the
# block are not interpreted. (Rules without a prefilter read every line, as configured.)
MAX_CANDIDATE_LINES = 4096


class Matcher:
    """The compiled rules of one engine: all of them, and those that still matter once serving."""

    def __init__(self, engine: Engine) -> None:
        rules = list(engine.all_rules())
        self.shards = engine.shards
        self.startup = compile_rules(rules, engine.shards)
        # Only a new launch, a stop or a failure leaves `serving`: other phase lines need not be looked at then,
        # nor lines that one request's error prints too.
        self.serving = compile_rules([r for r in rules if r.serving and (
            r.launch or r.stop or r.phase == "failed" or r.event)], None)
        self.routine_lines = engine.routine_lines
        self.heartbeats = engine.heartbeats
        # A whole line that holds a heartbeat, from its start (`\n`, `\r` or the block's), so one `sub` drops them.
        self.heartbeat_lines = None if engine.heartbeats is None else re.compile(
            rb"(?<![^\r\n])[^\r\n]*?(?:" + engine.heartbeats.pattern + rb")[^\r\n]*")
        launch = [strip_groups(r.pattern.pattern) for r in rules if r.launch]
        self.launch = re.compile(b"|".join(launch) or b"(?!)", re.MULTILINE)


class PhaseSnapshot(NamedTuple):
    phase: str
    since: float
    shards_loaded: int | None
    shards_expected: int | None
    events: dict[str, int]


@dataclass
class ShardBars:
    """Weight shard progress of one launch over its progress bars: a speculative draft model's bar (`1/1`, or the
    target's `N/N` again for MTP) adds to the target's, which it never replaces."""

    done: int = 0  # shards of the bars that completed before the current one
    loaded: int = 0
    total: int | None = None

    def update(self, loaded: int, total: int) -> None:
        if self.total is not None and (total != self.total or loaded < self.loaded):  # a new bar
            self.done += self.total if self.loaded >= self.total else 0
        self.loaded, self.total = loaded, total

    def progress(self) -> tuple[int | None, int | None]:
        return (None, None) if self.total is None else (self.done + self.loaded, self.done + self.total)


class LogInterpreter:
    """Current phase, when it began, weight shard progress, event counts, last progress and stats-line figures of
    one server. Fed from one log thread; read by any under its lock."""

    def __init__(self, engine: Engine, wall: Callable[[], float] = time.time,
                 tap: Callable[[bytes], None] | None = None) -> None:
        """`tap` sees every block fed, ANSI codes stripped (a server's `LogTail`)."""
        self.engine = engine
        self.matcher = Matcher(engine)
        self._wall = wall
        self._lock = threading.Lock()
        self.phase = "stopped"
        self.since = wall()
        self.shards = ShardBars()
        self.events: Counter[str] = Counter({event: 0 for event in EVENTS})
        self.last_events_at: dict[str, float] = {}
        self.launches = 0
        self.last_launch = float("-inf")
        self.fatal_in_launch = False
        self.stopping = False  # the engine said it was asked to stop, in this launch
        self.banner_seen = False  # the engine's launch banner, in this launch
        self.last_progress: float | None = None  # when a line that is not a heartbeat last came
        self.stats = StatsLineIntegrator(engine.stats_lines)
        self._timeline: list[str] = [self.phase]  # the phases of the current launch, in order
        self.tap = tap

    # -- log input -------------------------------------------------------------------------------------
    def feed(self, block: bytes, count_events: bool = True) -> None:
        """Complete lines (ending in `\\n` or `\\r`) from any of the server's logs, in order."""
        if b"\x1b" in block:
            block = ANSI.sub(b"", block)
        if self.tap is not None:
            self.tap(block)
        with self._lock:
            self._progress(block)
            # Read before the bulk skip below drops the stats lines; counted after the block's launch lines.
            stats = self.stats.read(block) if count_events and self.stats.lines else []
            if self.phase == "serving" and self.matcher.routine_lines is not None:
                block = self.matcher.routine_lines.sub(b"", block)
            events = self._scan(block, count_events)
            if events:
                self._count(events)
            if stats:
                self.stats.apply(stats, self._wall())

    def _scan(self, block: bytes, count_events: bool) -> list[str]:
        """Run the candidate lines through the rules; the events they count, one per line and event."""
        events: list[str] = []
        pos, size, candidates = 0, len(block), 0
        newline = -1  # the first `\n` at or after the last hit; `size` when there is none
        while pos < size and candidates < MAX_CANDIDATE_LINES:
            compiled = self.matcher.serving if self.phase == "serving" else self.matcher.startup
            if compiled.prefilter is None:
                at = pos
            else:
                hit = compiled.prefilter.search(block, pos)
                if hit is None:
                    break
                at, candidates = hit.start(), candidates + 1
            if newline < at:  # kept between hits: a block without `\n` after them is searched once, not per hit
                newline = block.find(b"\n", at)
                newline = size if newline < 0 else newline
            start, end = line_bounds(block, pos, at, newline)
            events += self._line(compiled.matches(block, start, end, at), compiled.rules, count_events)
            pos = end + 1
        return events

    def _progress(self, block: bytes) -> None:
        """A block with a line that is not a heartbeat is progress (a replayed one is dated by `recovered`)."""
        heartbeats, lines = self.matcher.heartbeats, self.matcher.heartbeat_lines
        if heartbeats is not None and lines is not None and heartbeats.search(block) is not None:
            block = lines.sub(b"", block)  # what is left is the lines that are not heartbeats
        if block and not block.isspace():
            self.last_progress = self._wall()

    def _line(self, matches: Iterator[tuple[str, re.Match[bytes]]], rules: dict[str, Rule],
              count_events: bool) -> set[str]:
        seen: set[str] = set()
        for group, match in matches:
            if group == SHARDS:
                self._shards(match.group(0))
                self._line_phase("loading_weights", count_events)
                continue
            r = rules[group]
            if r.stop and self.phase != "failed":
                self.stopping = True
            if self.stopping and (r.event == "fatal" or r.phase == "failed"):
                continue  # the engine's own shutdown (children ended by its SIGTERM), not a crash
            if r.event and count_events:  # one count per line and event
                seen.add(r.event)
            if r.event == "fatal":
                self.fatal_in_launch = True
            if r.phase is not None:
                self._line_phase(r.phase, count_events, r.launch)
        return seen

    def _count(self, events: list[str]) -> None:
        """Count a block's events at once: one clock read for the block, not one per line."""
        self.events.update(events)
        now = self._wall()
        self.last_events_at.update(dict.fromkeys(events, now))

    def _shards(self, text: bytes) -> None:
        found = self.matcher.shards.search(text) if self.matcher.shards else None
        if found:
            self.shards.update(int(found.group(1)), int(found.group(2)))

    def _line_phase(self, phase: str, count_events: bool, banner: bool = False) -> None:
        if phase == "launching":
            # A launch's first banner is its own, whether the launch began at a new main process or the probe made
            # it `serving` before the log was read; a later one starts a new launch once this one got past
            # launching (a wrapper's banner before the engine's does not). Any other launching line (a draft
            # model's distributed init) starts one only when none was seen.
            if self.launches == 0 or (banner and self.banner_seen and self.phase != "launching"):
                self._launch(count_events)
            self.banner_seen = self.banner_seen or banner
            return
        if self.phase == "failed" or (self.phase == "serving" and phase != "failed"):
            return  # only a new launch leaves `failed`; only a failure leaves `serving`
        self._enter(phase)

    def _launch(self, count_restart: bool) -> None:
        self.launches += 1
        if self.launches > 1 and count_restart:
            self._count(["server_restart"])
        self.last_launch = self._wall()
        self.shards = ShardBars()
        self.fatal_in_launch = self.stopping = self.banner_seen = False
        self.stats.relaunched()
        self._enter("launching")
        self._timeline = ["launching"]

    def _enter(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.since = self._wall()
            self._timeline = [*self._timeline[-31:], phase]

    def use(self, engine: Engine) -> None:
        """Read the next lines with `engine`'s rules (a server found to be a worker node reads its own)."""
        if engine is self.engine:
            return
        matcher = Matcher(engine)
        with self._lock:
            self.engine, self.matcher = engine, matcher

    # -- other signals ---------------------------------------------------------------------------------
    def process_started(self, create_time: float) -> None:
        """A new main process: a launch, unless its log already said so."""
        with self._lock:
            if self.last_launch < create_time - 1.0:
                self._launch(count_restart=True)

    def process_gone(self) -> None:
        with self._lock:
            self._enter("failed" if self.fatal_in_launch or self.phase == "failed" else "stopped")

    def probe_succeeded(self, at: float) -> None:
        """A health probe that answered after the phase began: the server is serving."""
        with self._lock:
            if self.phase != "serving" and at > self.since:
                self._enter("serving")

    def recovered(self, since: float) -> None:
        """After replaying an existing log at exporter start, date the phase from the file's mtime."""
        with self._lock:
            self.since = min(self.since, since)
            if self.last_progress is not None:
                self.last_progress = min(self.last_progress, since)

    def progress(self) -> float | None:
        with self._lock:
            return self.last_progress

    def figures(self) -> Figures | None:
        """Running, waiting and generated tokens from the engine's stats lines; None before the first one."""
        with self._lock:
            return self.stats.figures()

    def timeline(self) -> list[str]:
        """The phases of the current launch, in order."""
        with self._lock:
            return list(self._timeline)

    def has_launch(self, text: bytes) -> bool:
        """Whether `text` holds a line that starts a launch (where a restarted exporter replays a log from)."""
        return self.matcher.launch.search(text) is not None

    def snapshot(self) -> PhaseSnapshot:
        with self._lock:
            return PhaseSnapshot(self.phase, self.since, *self.shards.progress(), dict(self.events))

    def last_events(self) -> dict[str, float]:
        """When each kind of event was last counted, seconds since the epoch."""
        with self._lock:
            return dict(self.last_events_at)
