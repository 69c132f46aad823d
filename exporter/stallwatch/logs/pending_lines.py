"""Requests pending in PD stages from an engine's batch lines (SGLang's `#bootstrap-req: N, #inflight-req: M` and
`#prealloc-req: N, #transfer-req: M`, vLLM's `KV fetch: A waiting to start, B in progress`), as `source="log"`
figures: the last line of each rank, summed over ranks. The lines are printed only while a batch runs, so the last
figures stand until the next line (a stuck pipeline prints none: its last pending count stays)."""

from __future__ import annotations

from dataclasses import dataclass, field

from stallwatch.engines.base import PENDING_STAGES, PendingLine
from stallwatch.logs.stats_lines import last_matches


@dataclass
class PendingReader:
    lines: tuple[PendingLine, ...]
    ranks: dict[tuple[int, bytes], dict[str, int]] = field(default_factory=dict)  # (line, rank) -> stage -> count

    def read(self, block: bytes) -> list[tuple[tuple[int, bytes], dict[str, int]]]:
        found = []
        for index, line in enumerate(self.lines):
            stages = [stage for stage in PENDING_STAGES if stage in line.pattern.groupindex]
            for rank, match in last_matches(block, line.anchor, line.pattern).items():
                found.append(((index, rank), {stage: int(match.group(stage)) for stage in stages}))
        return found

    def apply(self, found: list[tuple[tuple[int, bytes], dict[str, int]]]) -> None:
        self.ranks.update(found)

    def relaunched(self) -> None:
        self.ranks.clear()

    def pending(self) -> dict[str, float] | None:
        """Requests pending by stage over the ranks; None before the first such line."""
        if not self.ranks:
            return None
        out: dict[str, float] = {}
        for stages in self.ranks.values():
            for stage, count in stages.items():
                out[stage] = out.get(stage, 0.0) + count
        return out
