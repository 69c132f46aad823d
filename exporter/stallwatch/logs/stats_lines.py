"""The engine's periodic stats lines (vLLM's `Running: N reqs, Waiting: M reqs`, SGLang's `Decode batch, ...`):
requests running and waiting, and tokens generated, as `source="log"` figures.

The generated-tokens counter is integrated: each stats line's generation throughput (the engine's mean over the
window the line closes) times the seconds since that rank's previous line, at most the engine's `max_interval` (its
window: engines print no line while idle, so a longer gap is idle time, not generation).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stallwatch.engines.base import Figures, StatsLine
from stallwatch.logs.prefilter import line_bounds

MAX_STATS_LINES = 64  # per block, read back from its end: the last line of each rank


def last_matches(block: bytes, anchor: bytes, pattern: re.Pattern[bytes]) -> dict[bytes, re.Match[bytes]]:
    """The last line of each rank in `block` that holds `anchor` and matches `pattern` (its `rank` group, if any),
    read back from its end (a busy SGLang block holds thousands of batch lines: only the last ones are parsed)."""
    out: dict[bytes, re.Match[bytes]] = {}
    pos = len(block)
    for _ in range(MAX_STATS_LINES):
        at = block.rfind(anchor, 0, pos)
        if at < 0:
            break
        newline = block.find(b"\n", at)
        start, end = line_bounds(block, 0, at, len(block) if newline < 0 else newline)
        pos = start
        match = pattern.search(block, start, end)
        if match is None:
            continue
        rank = match.group("rank") if "rank" in pattern.groupindex else None
        key = rank.lstrip(b"0") if rank else b""
        if key in out:
            break  # every rank seen since: what is further back is older
        out[key] = match
    return out


def last_stats(block: bytes, line: StatsLine) -> dict[bytes, tuple[int, int, float]]:
    """The last stats line of each rank in `block`: rank -> (running, waiting, throughput)."""
    return {rank: (int(m.group("running")), int(m.group("waiting")), float(m.group("throughput")))
            for rank, m in last_matches(block, line.anchor, line.pattern).items()}


@dataclass
class _Rank:
    running: int
    waiting: int
    at: float


@dataclass
class StatsLineIntegrator:
    """Last seen figures of each rank from the stats lines, and tokens integrated from their throughput."""

    lines: tuple[StatsLine, ...]
    ranks: dict[bytes, _Rank] = field(default_factory=dict)
    tokens: float = 0.0
    at: float | None = None

    def read(self, block: bytes) -> list[tuple[StatsLine, dict[bytes, tuple[int, int, float]]]]:
        """The last stats line of each rank in `block`, for `apply` (after the block's launch lines are seen)."""
        return [(line, found) for line in self.lines if (found := last_stats(block, line))]

    def apply(self, found: list[tuple[StatsLine, dict[bytes, tuple[int, int, float]]]], now: float) -> None:
        for line, ranks in found:
            for rank, (running, waiting, throughput) in ranks.items():
                previous = self.ranks.get(rank)
                interval = line.max_interval if previous is None else min(now - previous.at, line.max_interval)
                self.tokens += throughput * max(interval, 0.0)
                self.ranks[rank] = _Rank(running, waiting, now)
                self.at = now

    def feed(self, block: bytes, now: float) -> None:
        self.apply(self.read(block), now)

    def relaunched(self) -> None:
        """A new launch: its ranks start with nothing running; the tokens counted so far stay."""
        self.ranks.clear()

    def figures(self) -> Figures | None:
        if self.at is None:
            return None
        ranks = self.ranks.values()
        return Figures(float(sum(r.running for r in ranks)), float(sum(r.waiting for r in ranks)), self.tokens,
                       self.at)
