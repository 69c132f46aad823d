"""Background loops: one function called every `interval` seconds until stopped (`run_every`), and one such loop
per key kept in step with the watched servers (`PerServerLoops`)."""

from __future__ import annotations

import logging
import threading
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


@dataclass
class _Loop(Generic[W, S]):
    work: W
    state: S
    stop: threading.Event


class PerServerLoops(Generic[K, W, S]):
    """One loop per key (a server, a server's probe URL) running `step(work, state)` every `interval(work)`.
    `reconcile` keeps them in step with what is wanted now: a key no longer wanted stops its loop; a key whose work
    changed (compared with `==`) restarts it with the same state, so the counters it keeps never go back."""

    def __init__(self, step: Callable[[W, S], None], interval: Callable[[W], float], name: Callable[[W], str],
                 new_state: Callable[[K], S]) -> None:
        self._step, self._interval, self._name, self._new_state = step, interval, name, new_state
        self._lock = threading.Lock()
        self._loops: dict[K, _Loop[W, S]] = {}

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
                state = loop.state if loop is not None else self._new_state(key)
                self._loops[key] = _Loop(work, state, threading.Event())
                run_every(self._interval(work), lambda w=work, s=state: self._step(w, s), self._name(work),
                          self._loops[key].stop)

    def states(self) -> list[S]:
        with self._lock:
            return [loop.state for loop in self._loops.values()]
