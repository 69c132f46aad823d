"""Background loops: one function called every `interval` seconds until stopped (`run_every`), and one such loop
per key kept in step with the watched servers, on a bounded pool of threads (`PerServerLoops`)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
W = TypeVar("W")
S = TypeVar("S")


def run_every(interval: float, action: Callable[[], None], name: str, stop: threading.Event,
              delay_first: bool = False, wake: threading.Event | None = None, settle: float = 0.0) -> threading.Thread:
    """A daemon thread running `action` (first after `interval` when `delay_first`) until `stop` is set; a call
    that raises is logged and the loop goes on. `wake` (inotify's) ends a wait early, after which `settle`
    seconds pass so that a burst of wake-ups makes one call; whoever sets `stop` sets `wake` too."""
    def pause() -> bool:
        if wake is None:
            return stop.wait(interval)
        wake.wait(interval)
        wake.clear()
        return stop.wait(settle)

    def loop() -> None:
        if delay_first and pause():
            return
        while True:
            try:
                action()
            except Exception:
                log.exception("%s failed", name)
            if pause():
                return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


POOL_WORKERS = 8  # threads of one PerServerLoops, however many servers: each step is bounded by its own deadline


@dataclass
class _Loop(Generic[W, S]):
    work: W
    state: S
    stop: threading.Event
    interval: float
    name: str
    due: float = 0.0


class PerServerLoops(Generic[K, W, S]):
    """One loop per key (a server, a server's probe URL) running `step(work, state)` every `interval(work)`, on a
    pool of POOL_WORKERS threads shared by all keys (any user can start processes that are discovered as servers:
    threads per server would grow with them). `reconcile` keeps them in step with what is wanted now: a key no longer
    wanted stops its loop; a key whose work changed (compared with `==`) restarts it with the same state, so the
    counters it keeps never go back. A loop's next step is due `interval` after its last one ended; one loop never
    runs two steps at once, and the loop due first runs first. The pool's threads are named `<pool> N` (N from
    0), as docs/architecture.md lists them."""

    def __init__(self, step: Callable[[W, S], None], interval: Callable[[W], float], name: Callable[[W], str],
                 new_state: Callable[[K, W], S], workers: int = POOL_WORKERS,
                 clock: Callable[[], float] = time.monotonic, pool: str = "loop pool") -> None:
        self._step, self._interval, self._name, self._new_state = step, interval, name, new_state
        self._workers, self._clock, self._pool = workers, clock, pool
        self._lock = threading.Condition()
        self._loops: dict[K, _Loop[W, S]] = {}
        self._due: list[tuple[float, int, _Loop[W, S]]] = []  # heap of loops waiting for their next step
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []

    def reconcile(self, wanted: Mapping[K, W]) -> None:
        with self._lock:
            for key in set(self._loops) - set(wanted):
                self._loops.pop(key).stop.set()
            for key, work in wanted.items():
                loop = self._loops.get(key)
                if loop is not None and loop.work == work:
                    continue
                if loop is not None:
                    loop.stop.set()
                state = loop.state if loop is not None else self._new_state(key, work)
                self._loops[key] = fresh = _Loop(work, state, threading.Event(), self._interval(work),
                                                 self._name(work))
                self._schedule(fresh, self._clock())
            while len(self._threads) < min(self._workers, len(self._loops)):
                thread = threading.Thread(target=self._work, name=f"{self._pool} {len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def states(self) -> list[S]:
        with self._lock:
            return [loop.state for loop in self._loops.values()]

    def _schedule(self, loop: _Loop[W, S], due: float) -> None:
        loop.due = due
        heapq.heappush(self._due, (due, next(self._order), loop))
        self._lock.notify()

    def _next(self) -> _Loop[W, S]:
        """The loop due first, once it is due (stopped ones are dropped)."""
        with self._lock:
            while True:
                while self._due and self._due[0][2].stop.is_set():
                    heapq.heappop(self._due)
                wait = self._due[0][0] - self._clock() if self._due else None
                if wait is not None and wait <= 0:
                    return heapq.heappop(self._due)[2]
                self._lock.wait(wait)

    def _work(self) -> None:
        while True:
            loop = self._next()
            try:
                self._step(loop.work, loop.state)
            except Exception:
                log.exception("%s failed", loop.name)
            with self._lock:
                if not loop.stop.is_set():
                    self._schedule(loop, self._clock() + loop.interval)
