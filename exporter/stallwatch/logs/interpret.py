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

from stallwatch.engines.base import EVENTS, Engine, Figures, Rule
from stallwatch.logs import tracebacks
from stallwatch.logs.formats import ANSI
from stallwatch.logs.pending_lines import PendingReader
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
        # Only a new launch, a stop, a failure or a model's load leaves `serving`: other phase lines need not be
        # looked at then, nor lines that one request's error prints too.
        self.serving = compile_rules([r for r in rules if r.serving and (
            r.launch or r.stop or r.phase == "failed" or r.event or r.model_load)], None)
        self.routine_lines = engine.routine_lines
        self.heartbeats = engine.heartbeats
        # A whole line that holds a heartbeat, from its start (`\n`, `\r` or the block's), so one `sub` drops them.
        self.heartbeat_lines = None if engine.heartbeats is None else re.compile(
            rb"(?<![^\r\n])[^\r\n]*?(?:" + engine.heartbeats.pattern + rb")[^\r\n]*")
        self.line_prefix = re.compile(engine.line_prefix)
        launch = [strip_groups(r.pattern.pattern) for r in rules if r.launch]
        self.launch = re.compile(b"|".join(launch) or b"(?!)", re.MULTILINE)


@dataclass(frozen=True)
class PhaseSnapshot:
    """What the log (with the process and probes) says of a server at one moment, taken under one lock."""

    phase: str
    since: float  # when the phase began, seconds since the epoch
    shards_loaded: int | None
    shards_expected: int | None
    events: dict[str, int]  # each event's count
    last_events: dict[str, float]  # when each was last counted
    progress: float | None  # when a line that is not a heartbeat last came
    timeline: tuple[str, ...]  # the phases of the current launch, in order
    launches: int  # launches seen, the replayed ones included
    figures: Figures | None  # running, waiting and generated tokens from the stats lines; None before the first
    stop_requested: bool  # the current launch logged that it was asked to stop (a stop line, Ctrl-C's traceback)
    pending: dict[str, float] | None = None  # a PD member's pending requests by stage from its batch lines


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
    one server. Fed by the log follower (`feed`), discovery (`process_started`, `process_gone`) and the probes
    (`probe_succeeded`), each under its lock; read whole by `snapshot()`. Its state is its own."""

    def __init__(self, engine: Engine, wall: Callable[[], float] = time.time,
                 tap: Callable[[bytes], None] | None = None) -> None:
        """`tap` sees every block fed, ANSI codes stripped (a server's `LogTail`)."""
        self._engine = engine
        self._matcher = Matcher(engine)
        self._wall = wall
        self._lock = threading.Lock()
        self._phase = "stopped"
        self._since = wall()
        self._shards = ShardBars()
        self._events: Counter[str] = Counter({event: 0 for event in EVENTS})
        self._last_events_at: dict[str, float] = {}
        self._launches = 0
        self._last_launch = float("-inf")
        self._fatal_in_launch = False
        self._stopping = False  # the engine said it was asked to stop, in this launch
        self._gone = False  # the main process ended and no launch came since
        self._model_load = False  # the phase is one model's load in a serving server (`Rule.model_load`)
        self._banner_seen = False  # the engine's launch banner, in this launch
        self._main_banner_seen = False  # a banner that is no `second_banner`, in this launch
        self._last_progress: float | None = None  # when a line that is not a heartbeat last came
        self._stats = StatsLineIntegrator(engine.stats_lines)
        self._pending = PendingReader(())  # none until the server is known to be a PD member (`track_pending`)
        self._timeline: list[str] = [self._phase]  # the phases of the current launch, in order
        self._traceback: tracebacks.Open | None = None  # one whose end is in a block not read yet
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
            if self._traceback is not None:  # the end of the last block's traceback, first
                self._judge_open(self._read_traceback(block, 0, self._traceback))
            # Read before the bulk skip below drops the stats lines; counted after the block's launch lines.
            stats = self._stats.read(block) if count_events and self._stats.lines else []
            pending = self._pending.read(block) if count_events and self._pending.lines else []
            if self._phase == "serving" and self._matcher.routine_lines is not None:
                block = self._matcher.routine_lines.sub(b"", block)
            events = self._scan(block, count_events)
            if events:
                self._count(events)
            if stats:
                self._stats.apply(stats, self._wall())
            if pending:
                self._pending.apply(pending)

    def _scan(self, block: bytes, count_events: bool) -> list[str]:
        """Run the candidate lines through the rules; the events they count, one per line and event."""
        events: list[str] = []
        pos, size, candidates = 0, len(block), 0
        newline = -1  # the first `\n` at or after the last hit; `size` when there is none
        while pos < size and candidates < MAX_CANDIDATE_LINES:
            compiled = self._matcher.serving if self._phase == "serving" else self._matcher.startup
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
            events += self._line(compiled.matches(block, start, end, at), compiled.rules, count_events,
                                 lambda end=end: self._read_traceback(block, end + 1,
                                                                      tracebacks.Open(0, False, count_events)))
            pos = end + 1
        return events

    def _progress(self, block: bytes) -> None:
        """A block with a line that is not a heartbeat is progress (a replayed one is dated by `recovered`)."""
        heartbeats, lines = self._matcher.heartbeats, self._matcher.heartbeat_lines
        if heartbeats is not None and lines is not None and heartbeats.search(block) is not None:
            block = lines.sub(b"", block)  # what is left is the lines that are not heartbeats
        if block and not block.isspace():
            self._last_progress = self._wall()

    def _line(self, matches: Iterator[tuple[str, re.Match[bytes]]], rules: dict[str, Rule], count_events: bool,
              traceback: Callable[[], tracebacks.Judged | tracebacks.Open]) -> set[str]:
        """The events of one line; `traceback` reads on to the end of the traceback the line begins."""
        seen: set[str] = set()
        opened = False  # this line began a traceback whose end is in a later block
        for group, match in matches:
            if group == SHARDS:
                self._shard_line(match.group(0))
                self._line_phase("loading_weights", count_events)
                continue
            r = rules[group]
            if r.stop and self._phase != "failed":
                self._stopping = True
            if self._stopping and not r.after_stop and (r.event == "fatal" or r.phase == "failed"):
                continue  # the engine's own shutdown (children ended by its SIGTERM), not a crash
            if r.traceback:
                verdict = traceback()
                opened = isinstance(verdict, tracebacks.Open)
                if self._judge_traceback(verdict) and count_events:
                    seen.add("fatal")
                continue
            if r.event and count_events:  # one count per line and event
                seen.add(r.event)
            if r.event == "fatal" and not r.runner:
                self._fatal_in_launch = True
            if r.phase is not None:
                self._line_phase(r.phase, count_events, r.launch, r.second_banner, r.model_load)
        if opened and "fatal" in seen and self._traceback is not None:
            # The line counted its fatal already (`Scheduler hit an exception: Traceback ...`): one count per line
            # and event, however many blocks its traceback spans.
            self._traceback = self._traceback._replace(count_events=False)
        return seen

    def _read_traceback(self, block: bytes, pos: int, state: tracebacks.Open) -> tracebacks.Judged | tracebacks.Open:
        return tracebacks.judge(block, pos, state, self._matcher.line_prefix)

    def _judge_open(self, verdict: tracebacks.Judged | tracebacks.Open) -> None:
        """Judge the traceback left open by an earlier block, counting as that block would have."""
        count = self._traceback is not None and self._traceback.count_events
        if self._judge_traceback(verdict) and count:
            self._count(["fatal"])

    def _judge_traceback(self, verdict: tracebacks.Judged | tracebacks.Open) -> bool:
        """A traceback that ended in a stop's exception is the stop; one that ended otherwise, a failure (True: a
        fatal event); one whose end is not read yet is judged when it is, or when the process is gone."""
        if isinstance(verdict, tracebacks.Open):
            self._traceback = verdict
            return False
        self._traceback = None
        if verdict.stop:
            self._stopping = self._stopping or self._phase != "failed"
            return False
        if self._stopping:
            return False
        self._fatal_in_launch = True
        return True

    def _count(self, events: list[str]) -> None:
        """Count a block's events at once: one clock read for the block, not one per line."""
        self._events.update(events)
        now = self._wall()
        self._last_events_at.update(dict.fromkeys(events, now))

    def _shard_line(self, text: bytes) -> None:
        found = self._matcher.shards.search(text) if self._matcher.shards else None
        if found:
            self._shards.update(int(found.group(1)), int(found.group(2)))

    def _line_phase(self, phase: str, count_events: bool, banner: bool = False, second: bool = False,
                    model_load: bool = False) -> None:
        if phase == "launching":
            # A launch's first banner is its own, whether the launch began at a new main process or the probe made
            # it `serving` before the log was read; a later one starts a new launch once this one got past
            # launching (a wrapper's banner before the engine's does not). Any other launching line (a draft
            # model's distributed init) starts one only when none was seen.
            # A second banner after this launch's main one (an older llama.cpp's `ggml_cuda_init` at model load)
            # is this launch's.
            if self._launches == 0 or (banner and self._banner_seen and self._phase != "launching"
                                       and not (second and self._main_banner_seen)):
                self._launch(count_events)
            self._banner_seen = self._banner_seen or banner
            self._main_banner_seen = self._main_banner_seen or (banner and not second)
            return
        if self._phase == "failed" or (self._phase == "serving" and phase != "failed" and not model_load):
            return  # only a new launch leaves `failed`; only a failure (or a model's load) leaves `serving`
        self._enter(phase, model_load)

    def _launch(self, count_restart: bool) -> None:
        self._launches += 1
        if self._launches > 1 and count_restart:
            self._count(["server_restart"])
        self._last_launch = self._wall()
        self._shards = ShardBars()
        self._fatal_in_launch = self._stopping = self._banner_seen = self._main_banner_seen = self._gone = False
        self._stats.relaunched()
        self._pending.relaunched()
        self._enter("launching")
        self._timeline = ["launching"]

    def _enter(self, phase: str, model_load: bool = False) -> None:
        if phase != self._phase or model_load:
            self._model_load = model_load
        if phase != self._phase:
            self._phase = phase
            self._since = self._wall()
            self._timeline = [*self._timeline[-31:], phase]

    def use(self, engine: Engine) -> None:
        """Read the next lines with `engine`'s rules (a server found to be a worker node reads its own)."""
        if engine is self._engine:
            return
        matcher = Matcher(engine)
        with self._lock:
            self._engine, self._matcher = engine, matcher

    def track_pending(self, role: str) -> None:
        """Read the engine's pending-stage lines of a PD member of this role ("" none): each is one more look at each
        byte of a block (its anchor searched from the end), paid only by PD members."""
        lines = tuple(line for line in self._engine.pending_lines if role and line.role in ("", role))
        with self._lock:
            if lines != self._pending.lines:
                self._pending = PendingReader(lines)

    # -- other signals ---------------------------------------------------------------------------------
    def process_started(self, create_time: float) -> None:
        """A new main process: a launch, unless its log already said so."""
        with self._lock:
            self._gone = False
            if self._last_launch < create_time - 1.0:
                self._launch(count_restart=True)

    def process_gone(self) -> None:
        with self._lock:
            if self._traceback is not None:  # the process ended in the middle of one: a failure
                self._judge_open(tracebacks.Judged(False, 0))
            self._enter("failed" if self._fatal_in_launch or self._phase == "failed" else "stopped")
            self._stopping = self._stopping or (self._engine.exit_is_stop and self._phase == "stopped")
            self._gone = True

    def probe_succeeded(self, at: float) -> None:
        """A health probe that answered after the phase began: the server is serving, unless it failed after it
        served (an engine whose HTTP server outlives its engine: trtllm-serve's `/health` stays 200 until it
        notices that its executor died; only a new launch leaves that failure), or its process is gone (what
        answers is another's: a Service's other replica, or a probe sent before the process ended), or a model's load
        is under way (`Rule.model_load`: the probe says only that the server's API lives)."""
        with self._lock:
            served_then_failed = self._phase == "failed" and "serving" in self._timeline
            if (self._phase != "serving" and not served_then_failed and not self._gone and not self._model_load
                    and at > self._since):
                self._enter("serving")

    def recovered(self, since: float) -> None:
        """After replaying an existing log at exporter start, date the phase from the file's mtime."""
        with self._lock:
            self._since = min(self._since, since)
            if self._last_progress is not None:
                self._last_progress = min(self._last_progress, since)

    def has_launch(self, text: bytes) -> bool:
        """Whether `text` holds a line that starts a launch (where a restarted exporter replays a log from)."""
        return self._matcher.launch.search(text) is not None

    def snapshot(self) -> PhaseSnapshot:
        with self._lock:
            return PhaseSnapshot(self._phase, self._since, *self._shards.progress(), dict(self._events),
                                 dict(self._last_events_at), self._last_progress, tuple(self._timeline),
                                 self._launches, self._stats.figures(), self._stopping, self._pending.pending())
