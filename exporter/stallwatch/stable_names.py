"""Label values that stay the same across a server's restarts: what a probe or a log is to the server (`health`,
`stdout`, `container`), never where it is (a pod IP in a URL, a pod UID in a path), which its info series carries. A
restarted pod then makes new info series only, not a new set of every probe and log family
(docs/research/fleet-scale.md: ~16 new series per server and restart before)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

__all__ = ["distinct"]


def distinct(kinds: Iterable[str]) -> list[str]:
    """One name per item, in order: its kind, numbered from the second of a kind on (`file`, `file_2`, `file_3`)."""
    seen: Counter[str] = Counter()
    out = []
    for kind in kinds:
        seen[kind] += 1
        out.append(kind if seen[kind] == 1 else f"{kind}_{seen[kind]}")
    return out
