"""A log file that several watched servers' processes write (their stdout appended to one `shared.log`): each of its
lines is one server's at most, not every reader's (audit 2026-12-02 #6: a healthy server counted its neighbour's 9
relaunches and 18 fatal lines). A line is given to the server whose process wrote it where the engine's prefix names
the writer's pid (`Engine.line_pid`: vLLM's `(EngineCore_DP0 pid=7) `); every other line of a shared file is no one's
(`stallwatch_log_shared` says so): it still counts as the file's bytes and lines, never as a server's phase or events.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

__all__ = ["WriterFilter"]

KEPT_PIDS = 4096  # pids once in the server's tree, remembered: a process's last lines are read after it exited


class WriterFilter:
    """The lines of a block that the server's own processes wrote, by the pid in each line's prefix; none where the
    engine's lines carry no pid (`pattern` None). `pids()` is the server's tree now."""

    def __init__(self, pattern: re.Pattern[bytes] | None, pids: Callable[[], Iterable[int]]) -> None:
        self._pattern, self._pids = pattern, pids
        self._seen: dict[int, None] = {}  # in the order first seen, the oldest dropped first

    def __call__(self, block: bytes) -> bytes:
        if self._pattern is None:
            return b""
        for pid in self._pids():
            self._seen.pop(pid, None)
            self._seen[pid] = None
        while len(self._seen) > KEPT_PIDS:
            del self._seen[next(iter(self._seen))]
        own = []
        for line in block.splitlines(keepends=True):
            found = self._pattern.match(line)
            if found is not None and int(found.group(1)) in self._seen:
                own.append(line)
        return b"".join(own)
