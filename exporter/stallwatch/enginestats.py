"""The engine's own view of its work: requests running and waiting, and tokens generated, read from its `/metrics`
page (`source="metrics"`) or from its periodic stats log lines (`source="log"`).

From the log, the generated-tokens counter is integrated: each stats line's generation throughput (the engine's
mean over the window the line closes) times the seconds since that rank's previous line, at most the engine's
`max_interval` (its window: engines print no line while idle, so a longer gap is idle time, not generation).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from stallwatch.engines.base import MetricsSpec

MAX_STATS_LINES = 64  # per block, read back from its end: the last line of each rank


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
