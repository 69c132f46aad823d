"""The engine's own view of its work: requests running and waiting, and tokens generated, read from its `/metrics`
page (`source="metrics"`) or from its periodic stats log lines (`source="log"`).

From the log, the generated-tokens counter is integrated: each stats line's generation throughput (the engine's
mean over the window the line closes) times the seconds since that rank's previous line, at most the engine's
`max_interval` (its window: engines print no line while idle, so a longer gap is idle time, not generation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from stallwatch.engines.base import MetricsSpec, StatsLine

MAX_STATS_LINES = 64  # per block, read back from its end: the last line of each rank


class Figures(NamedTuple):
    running: float
    waiting: float
    tokens: float  # generated tokens so far (a counter)
    at: float  # when these figures were seen, seconds since the epoch


# -- the /metrics page --------------------------------------------------------------------------------------------


def _wanted_lines(text: str, names: Sequence[str]) -> str:
    """Only the lines of our families (samples, `# TYPE`, `# HELP`): a vLLM page holds hundreds of KB of
    histograms that the parser need not read."""
    prefixes = tuple(names) + tuple(f"# {kind} {name}" for kind in ("TYPE", "HELP") for name in names)
    return "\n".join(line for line in text.splitlines() if line.startswith(prefixes)) + "\n"


def _family_names(spec: MetricsSpec) -> list[str]:
    """The names a family line may start with: the sample names, and a counter's or histogram's family name."""
    names = [spec.running, spec.waiting, spec.tokens]
    for suffix in ("_total", "_sum"):
        names += [name[: -len(suffix)] for name in names if name.endswith(suffix)]
    return names


def _reduce(samples: Iterable[tuple[dict[str, str], float]], same_over: Sequence[str]) -> float | None:
    """Sum over label sets, after the largest value over the labels in `same_over`; None when no sample."""
    groups: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in samples:
        if math.isnan(value):
            continue
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in same_over))
        groups[key] = max(groups.get(key, value), value)
    return sum(groups.values()) if groups else None


def parse_page(text: str, spec: MetricsSpec) -> tuple[float, float, float]:
    """Running, waiting and generated tokens from an engine's metrics page; ValueError when one is missing."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {spec.running: [], spec.waiting: [], spec.tokens: []}
    for family in text_string_to_metric_families(_wanted_lines(text, _family_names(spec))):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name].append((sample.labels, sample.value))
    names = (spec.running, spec.waiting, spec.tokens)
    values = {name: _reduce(found[name], spec.same_over) for name in names}
    missing = [name for name in names if values[name] is None]
    if missing:
        raise ValueError(f"no samples of {', '.join(missing)}")
    odd = [name for name in names if not math.isfinite(values[name] or 0.0)]
    if odd:  # an Inf would stick in the monotonic counter for good (NaN samples are skipped above)
        raise ValueError(f"values that are not finite: {', '.join(odd)}")
    running, waiting, tokens = (float(values[name] or 0.0) for name in names)
    return running, waiting, tokens


@dataclass
class MonotonicCounter:
    """An engine counter that never goes down across an engine restart: when the engine's value drops (or its
    process changes), what it had counted before is kept as an offset."""

    offset: float = 0.0
    last: float | None = None
    launch: object = None

    def update(self, value: float, launch: object) -> float:
        if self.last is not None and (value < self.last or launch != self.launch):
            self.offset += self.last
        self.last, self.launch = value, launch
        return self.offset + value


# -- the stats log lines ------------------------------------------------------------------------------------------


def _line_bounds(block: bytes, at: int) -> tuple[int, int]:
    start = max(block.rfind(b"\n", 0, at), block.rfind(b"\r", 0, at)) + 1
    ends = [e for e in (block.find(b"\n", at), block.find(b"\r", at)) if e >= 0]
    return start, min(ends) if ends else len(block)


def last_stats(block: bytes, line: StatsLine) -> dict[bytes, tuple[int, int, float]]:
    """The last stats line of each rank in `block`, read back from its end (a busy SGLang block holds thousands
    of `Decode batch` lines: only the last ones are parsed): rank -> (running, waiting, throughput)."""
    out: dict[bytes, tuple[int, int, float]] = {}
    pos = len(block)
    for _ in range(MAX_STATS_LINES):
        at = block.rfind(line.anchor, 0, pos)
        if at < 0:
            break
        start, end = _line_bounds(block, at)
        pos = start
        match = line.pattern.search(block, start, end)
        if match is None:
            continue
        rank = match.group("rank") if "rank" in line.pattern.groupindex else None
        key = rank.lstrip(b"0") if rank else b""
        if key in out:
            break  # every rank seen since: what is further back is older
        out[key] = (int(match.group("running")), int(match.group("waiting")), float(match.group("throughput")))
    return out


@dataclass
class _Rank:
    running: int
    waiting: int
    at: float


@dataclass
class LogStats:
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
