"""Startup phase and notable events of one server, driven by its log lines and by its process and probes.

The hot path stays in the regex engine: one prefilter regex (a trie of literals that every rule's match
must contain) scans whole blocks of lines, and only the lines it hits are matched against the engine's
rules. Once a server is serving, only launch, failure and event rules stay in the prefilter: a busy server's
`Decode batch` lines then cost one scan.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from stallwatch.engines import EVENTS, Engine, Rule

try:  # Python 3.11+
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
_SHARDS = "shards"
_MIN_LITERAL = 4


@dataclass(frozen=True)
class _Compiled:
    prefilter: re.Pattern[bytes] | None  # literals that every rule's match contains; None: scan every line
    regex: re.Pattern[bytes]  # all rules, one named group each, run only on candidate lines
    rules: dict[str, Rule]  # group name -> rule


def _compile(rules: list[Rule], shards: re.Pattern[bytes] | None) -> _Compiled:
    parts: list[bytes] = []
    literals: set[bytes] | None = set()
    patterns = [(f"r{i}", r.pattern.pattern) for i, r in enumerate(rules)]
    if shards is not None:  # first: a shard line is also a loading_weights line
        patterns.insert(0, (_SHARDS, shards.pattern))
    for group, pattern in patterns:
        parts.append(b"(?P<%s>%s)" % (group.encode(), _strip_groups(pattern)))
        needed = required_literals(pattern)
        literals = None if literals is None or needed is None else literals | set(needed)
    by_group = {f"r{i}": r for i, r in enumerate(rules)}
    prefilter = None if literals is None else re.compile(_trie(sorted(literals)) or b"(?!)")
    return _Compiled(prefilter, re.compile(b"|".join(parts) or b"(?!)", re.MULTILINE), by_group)


def _strip_groups(pattern: bytes) -> bytes:
    """A rule as one branch of the combined alternation: its capturing groups become non-capturing, and
    leading global flags such as `(?i)` become scoped ones, which is all Python allows mid-pattern."""
    pattern = re.sub(rb"(?<!\\)\((?!\?)", b"(?:", pattern)
    flags = re.match(rb"\(\?([imsx]+)\)", pattern)
    return b"(?%s:%s)" % (flags.group(1), pattern[flags.end():]) if flags else pattern


def required_literals(pattern: bytes) -> list[bytes] | None:
    """Literal strings one of which every match of `pattern` contains; None when there are none to use."""
    tree = _sre_parse.parse(pattern.decode("latin-1"))
    if tree.state.flags & re.IGNORECASE:
        return None  # a literal would miss the other cases
    parsed = list(tree)
    if len(parsed) == 1 and parsed[0][0] is _sre_constants.BRANCH:
        out: list[bytes] = []
        for branch in parsed[0][1][1]:
            found = _longest_literal(list(branch))
            if found is None:
                return None
            out.append(found)
        return out
    found = _longest_literal(parsed)
    return None if found is None else [found]


def _longest_literal(items: list[tuple[object, object]]) -> bytes | None:
    """The literal run to prefilter on. Runs are cut to begin at a capital letter or `_` where that leaves
    enough, because the regex engine skips positions by first byte, and lower-case letters are everywhere."""
    runs, run = [], bytearray()
    for op, arg in [*items, (None, None)]:
        if op is _sre_constants.LITERAL:
            run.append(arg)  # type: ignore[arg-type]
            continue
        if run:
            runs.append(bytes(run))
        run = bytearray()
    capitalised = [r[m.start():] for r in runs
                   if (m := re.search(rb"[A-Z_]", r)) and len(r) - m.start() >= _MIN_LITERAL]
    candidates = capitalised or [r for r in runs if len(r) >= _MIN_LITERAL]
    return max(candidates, key=len) if candidates else None


def _trie(words: list[bytes]) -> bytes:
    """One regex for many literals, factored by common prefixes (the regex engine then rarely backtracks)."""
    root: dict = {}
    for word in words:
        node = root
        for byte in word:
            node = node.setdefault(byte, {})
        node[None] = {}

    def build(node: dict) -> bytes:
        branches = [re.escape(bytes([b])) + build(child) for b, child in sorted(
            ((k, v) for k, v in node.items() if k is not None))]
        if not branches:
            return b""
        body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
        return b"(?:" + body + b")?" if None in node else body

    return build(root)


class Matcher:
    """The compiled rules of one engine: all of them, and those that still matter once serving."""

    def __init__(self, engine: Engine) -> None:
        rules = list(engine.all_rules())
        self.shards = engine.shards
        self.startup = _compile(rules, engine.shards)
        # Only a new launch or a failure leaves `serving`: other phase lines need not be looked at then.
        self.serving = _compile([r for r in rules if r.phase in ("launching", "failed") or r.event], None)
        launch = [_strip_groups(r.pattern.pattern) for r in rules if r.phase == "launching"]
        self.launch = re.compile(b"|".join(launch) or b"(?!)", re.MULTILINE)


def _line_end(block: bytes, start: int) -> int:
    newline, carriage = block.find(b"\n", start), block.find(b"\r", start)
    ends = [e for e in (newline, carriage) if e >= 0]
    return min(ends) if ends else len(block)


class PhaseSnapshot(NamedTuple):
    phase: str
    since: float
    shards_loaded: int | None
    shards_expected: int | None
    events: dict[str, int]


class PhaseTracker:
    """Current phase, when it began, weight shard progress and event counts of one server."""

    def __init__(self, engine: Engine, wall: Callable[[], float] = time.time) -> None:
        self.matcher = Matcher(engine)
        self._wall = wall
        self._lock = threading.Lock()
        self.phase = "stopped"
        self.since = wall()
        self.shards_loaded: int | None = None
        self.shards_expected: int | None = None
        self.events: Counter[str] = Counter({event: 0 for event in EVENTS})
        self.launches = 0
        self.last_launch = float("-inf")
        self.fatal_in_launch = False

    # -- log input -------------------------------------------------------------------------------------
    def feed(self, block: bytes, count_events: bool = True) -> None:
        """Complete lines (ending in `\\n` or `\\r`) from any of the server's logs, in order."""
        if b"\x1b" in block:
            block = ANSI.sub(b"", block)
        with self._lock:
            pos, size = 0, len(block)
            while pos < size:
                compiled = self.matcher.serving if self.phase == "serving" else self.matcher.startup
                if compiled.prefilter is None:
                    start = pos
                else:
                    hit = compiled.prefilter.search(block, pos)
                    if hit is None:
                        return
                    start = max(block.rfind(b"\n", 0, hit.start()), block.rfind(b"\r", 0, hit.start())) + 1
                end = _line_end(block, start)
                self._line(compiled, block, start, end, count_events)
                pos = end + 1

    def _line(self, compiled: _Compiled, block: bytes, start: int, end: int, count_events: bool) -> None:
        seen: set[str] = set()
        for match in compiled.regex.finditer(block, start, end):
            group = match.lastgroup
            if group == _SHARDS:
                self._shards(match.group(0))
                self._line_phase("loading_weights", count_events)
                continue
            r = compiled.rules[group]  # type: ignore[index]
            if r.event and count_events and r.event not in seen:  # one count per line and event
                seen.add(r.event)
                self.events[r.event] += 1
            if r.event == "fatal":
                self.fatal_in_launch = True
            if r.phase is not None:
                self._line_phase(r.phase, count_events)

    def _shards(self, text: bytes) -> None:
        found = self.matcher.shards.search(text) if self.matcher.shards else None
        if found:
            self.shards_loaded, self.shards_expected = int(found.group(1)), int(found.group(2))

    def _line_phase(self, phase: str, count_events: bool) -> None:
        if phase == "launching":
            if self.phase != "launching":
                self._launch(count_events)
            return
        if self.phase == "failed" or (self.phase == "serving" and phase != "failed"):
            return  # only a new launch leaves `failed`; only a failure leaves `serving`
        self._enter(phase)

    def _launch(self, count_restart: bool) -> None:
        self.launches += 1
        if self.launches > 1 and count_restart:
            self.events["server_restart"] += 1
        self.last_launch = self._wall()
        self.shards_loaded = self.shards_expected = None
        self.fatal_in_launch = False
        self._enter("launching")

    def _enter(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.since = self._wall()

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

    def snapshot(self) -> PhaseSnapshot:
        with self._lock:
            return PhaseSnapshot(self.phase, self.since, self.shards_loaded, self.shards_expected, dict(self.events))
