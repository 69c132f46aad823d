"""How much of one log file the follower thread reads, so that a file that grows faster than it can be read (a
process's stdout extended by 1 GiB a second: audit 2026-12-02 #14, 45-87 % of a core) costs a bounded share of
it: a byte rate per file (a token bucket with a second's burst), and a backlog past which the unread bytes are
skipped, counted as such (`stallwatch_log_skipped_bytes_total`), instead of being caught up on for as long as the
file grows. The backlog left is exported too (`stallwatch_log_backlog_bytes`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["READ_LIMITS", "ReadBudget", "ReadLimits"]


@dataclass(frozen=True)
class ReadLimits:
    # Real engines write kilobytes a second (a busy vLLM at debug level, a few MB): 16 MiB/s of one file is far
    # past any of them, and a few percent of a core (the audit read 300 MB/s at most of one).
    bytes_per_second: float = 16 << 20
    max_backlog_bytes: int = 64 << 20  # unread bytes past which the file skips to its end (four seconds at the rate)


READ_LIMITS = ReadLimits()


class ReadBudget:
    """One file's token bucket: `allows()` while bytes are left of the current second's share, `spend(n)` after a
    read (a read may overdraw: the next waits until the debt is paid). Not thread-safe: the follower thread's."""

    def __init__(self, limits: ReadLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self._clock = limits, clock
        self._tokens = limits.bytes_per_second
        self._at = clock()

    def allows(self) -> bool:
        now = self._clock()
        rate = self.limits.bytes_per_second
        self._tokens = min(rate, self._tokens + (now - self._at) * rate)
        self._at = now
        return self._tokens > 0

    def spend(self, count: int) -> None:
        self._tokens -= count

    def too_far_behind(self, unread: int) -> bool:
        return unread > self.limits.max_backlog_bytes
