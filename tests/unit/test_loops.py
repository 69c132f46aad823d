"""`PerServerLoops` on a test clock: the loop due first runs first, a loop's next step is due `interval` after its last
one ended, changed work keeps its state, one loop never runs two steps at once, a removed key's loop stops, a step
that raises does not stop the pool, and the threads stay `workers` however many keys there are.

Each step records its key and then waits, in its pool thread, until the test lets it end: the test knows what runs
and moves the clock between steps. Nothing here sleeps; a wait for a step gives up after WAIT seconds (a failure)."""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from stallwatch.loops import PerServerLoops
from support.clock import Clock

WAIT = 5.0


@dataclass(frozen=True)
class Work:
    key: str
    interval: float
    version: int = 0


@dataclass
class State:
    key: str
    versions: list[int] = field(default_factory=list)  # of the work of each step, in order


class Steps:
    """The step under test: records the key, then waits until `release(key)` (a key in `free` does not wait; one in
    `raising` raises), and counts how many steps of each key run at once."""

    def __init__(self, free: set[str] | None = None, raising: set[str] | None = None) -> None:
        self.free, self.raising = free or set(), raising or set()
        self.ran: queue.Queue[str] = queue.Queue()
        self.most: Counter[str] = Counter()  # the most steps of a key running at once
        self.new_states: Counter[str] = Counter()
        self._running: Counter[str] = Counter()
        self._gates: dict[str, threading.Semaphore] = {}
        self._lock = threading.Lock()
        self._closing = False

    def __call__(self, work: Work, state: State) -> None:
        with self._lock:
            self._running[work.key] += 1
            self.most[work.key] = max(self.most[work.key], self._running[work.key])
            gate, closing = self._gate(work.key), self._closing
        try:
            state.versions.append(work.version)
            self.ran.put(work.key)
            if work.key not in self.free and not closing:
                gate.acquire(timeout=WAIT)
            if work.key in self.raising:
                raise RuntimeError(f"step of {work.key} failed")
        finally:
            with self._lock:
                self._running[work.key] -= 1

    def new_state(self, key: str, _work: Work) -> State:
        self.new_states[key] += 1
        return State(key)

    def next(self) -> str:
        """The key of the next step begun (waiting for it at most WAIT seconds)."""
        try:
            return self.ran.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"no step began within {WAIT:g}s")

    def release(self, key: str) -> None:
        with self._lock:
            self._gate(key).release()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            for gate in self._gates.values():
                gate.release()

    def _gate(self, key: str) -> threading.Semaphore:
        return self._gates.setdefault(key, threading.Semaphore(0))


Make = Callable[..., "PerServerLoops[str, Work, State]"]


@pytest.fixture
def make() -> Iterator[Make]:
    """Pools on a test clock; each is emptied at the end (its threads then wait for work that never comes)."""
    made: list[tuple[PerServerLoops[str, Work, State], Steps]] = []

    def build(steps: Steps, clock: Clock, workers: int = 1) -> PerServerLoops[str, Work, State]:
        pool: PerServerLoops[str, Work, State] = PerServerLoops(
            steps, lambda work: work.interval, lambda work: f"loop {work.key}", steps.new_state, workers=workers,
            clock=clock)
        made.append((pool, steps))
        return pool

    yield build
    for pool, steps in made:
        pool.reconcile({})
        steps.close()


def _wanted(*works: Work) -> dict[str, Work]:
    return {work.key: work for work in works}


def test_the_loop_due_first_runs_first(make: Make) -> None:
    """Of two loops both due, the one due earlier runs first, though the other was queued before it."""
    clock, steps = Clock(0.0), Steps()
    pool = make(steps, clock)
    x, y, z = Work("x", 100.0), Work("y", 1.0), Work("z", 1000.0)
    pool.reconcile(_wanted(x, y))
    assert steps.next() == "x"
    steps.release("x")  # x: next due at 100
    assert steps.next() == "y"
    pool.reconcile(_wanted(x, y, z))  # z: due now, after y
    steps.release("y")  # y: next due at 1, queued after x
    assert steps.next() == "z"
    clock.now = 200.0  # z took long: x (due 100) and y (due 1) are both due when it ends
    steps.release("z")
    assert steps.next() == "y"
    steps.release("y")
    assert steps.next() == "x"


def test_the_next_step_is_due_an_interval_after_the_last_one_ended(make: Make) -> None:
    """A step that took 5 s of a 10 s interval makes the next one due at 15, not at 10."""
    clock, steps = Clock(0.0), Steps()
    pool = make(steps, clock)
    x, m, s, t = Work("x", 10.0), Work("m", 1000.0), Work("s", 1000.0), Work("t", 1000.0)
    pool.reconcile(_wanted(x))
    assert steps.next() == "x"
    pool.reconcile(_wanted(x, m))  # m: due now, to begin once x's step ended and x was queued again
    clock.now = 5.0
    steps.release("x")
    assert steps.next() == "m"
    clock.now = 12.0
    pool.reconcile(_wanted(x, m, s))  # s: due at 12, x at 15
    steps.release("m")
    assert steps.next() == "s"
    steps.release("s")
    clock.now = 15.0
    pool.reconcile(_wanted(x, m, s, t))  # t: due at 15, queued after x
    assert steps.next() == "x"


def test_changed_work_restarts_its_loop_with_the_same_state(make: Make) -> None:
    """Work that changed runs at once with the state its key had; work equal to the last is left as it runs."""
    clock, steps = Clock(0.0), Steps(free={"x", "s"})
    pool = make(steps, clock)
    x, s = Work("x", 1000.0), Work("s", 1000.0)
    pool.reconcile(_wanted(x))
    assert steps.next() == "x"
    pool.reconcile(_wanted(Work("x", 1000.0), s))  # equal work: not restarted, so s (queued after it) runs first
    assert steps.next() == "s"
    pool.reconcile(_wanted(Work("x", 1000.0, version=1), s))
    assert steps.next() == "x"
    assert steps.ran.empty()
    states = {state.key: state for state in pool.states()}
    assert states["x"].versions == [0, 1] and states["s"].versions == [0]
    assert steps.new_states == {"x": 1, "s": 1}


def test_one_loop_never_runs_two_steps_at_once(make: Make) -> None:
    """While a loop's step runs, a free pool thread takes other work and never a second step of that loop."""
    clock, steps = Clock(0.0), Steps()
    pool = make(steps, clock, workers=2)
    x, s = Work("x", 0.0), Work("s", 1000.0)  # x: due again as soon as its step ends
    pool.reconcile(_wanted(x))
    assert steps.next() == "x"
    pool.reconcile(_wanted(x, s))
    assert steps.next() == "s"  # the second thread, while x runs
    steps.release("s")
    steps.release("x")
    assert steps.next() == "x"
    steps.release("x")
    assert steps.next() == "x"
    assert steps.most == {"x": 1, "s": 1}


def test_a_removed_keys_loop_stops(make: Make) -> None:
    """A key no longer wanted never steps again, whether its step was running or waiting, and its state is dropped."""
    clock, steps = Clock(0.0), Steps()
    pool = make(steps, clock)
    x, y, z, s = Work("x", 0.0), Work("y", 1000.0), Work("z", 0.0), Work("s", 1000.0)  # x, z: always due
    pool.reconcile(_wanted(x, y, z))
    assert steps.next() == "x"
    pool.reconcile(_wanted(y))  # x is running, z waits its turn
    steps.release("x")
    assert steps.next() == "y"
    steps.release("y")
    pool.reconcile(_wanted(y, s))  # s: due now, queued after what x and z would have left
    assert steps.next() == "s"
    assert sorted(state.key for state in pool.states()) == ["s", "y"]


def test_a_step_that_raises_is_logged_and_its_loop_and_the_pool_go_on(
        make: Make, caplog: pytest.LogCaptureFixture) -> None:
    """An exception in one step is logged with its loop's name; that loop steps again and the others still run."""
    caplog.set_level(logging.ERROR, logger="stallwatch.loops")
    clock, steps = Clock(0.0), Steps(raising={"x"})
    pool = make(steps, clock)  # one thread: the one the exception is raised in
    x, y, s = Work("x", 10.0), Work("y", 10.0), Work("s", 1000.0)
    pool.reconcile(_wanted(x, y))
    assert steps.next() == "x"
    steps.release("x")  # raises; x is due again at 10
    assert steps.next() == "y"
    (record,) = [r for r in caplog.records if r.name == "stallwatch.loops"]
    assert record.getMessage() == "loop x failed" and record.exc_info is not None
    clock.now = 10.0
    pool.reconcile(_wanted(x, y, s))  # s: due at 10, after x
    steps.release("y")
    assert steps.next() == "x"
    steps.release("x")
    assert steps.next() == "s"


def _pool_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("loop pool ")}


def test_the_threads_stay_workers_however_many_keys(make: Make) -> None:
    """Twenty keys run on `workers` threads, started as keys came; no key starts none."""
    clock, steps = Clock(0.0), Steps()
    before = _pool_threads()
    pool = make(steps, clock, workers=3)
    pool.reconcile({})
    assert _pool_threads() == before
    pool.reconcile(_wanted(Work("k0", 1.0), Work("k1", 1.0)))
    assert len(_pool_threads() - before) == 2
    pool.reconcile(_wanted(*(Work(f"k{i}", 1.0) for i in range(20))))
    assert len(_pool_threads() - before) == 3
    assert sorted(steps.next() for _ in range(3)) == ["k0", "k1", "k2"]  # three at once, in the order queued
