"""What bounds `stallwatch diagnose`: one deadline per stage, on the clock it is given."""

from __future__ import annotations

from stallwatch.report.oneshot import Deadline
from support.clock import Clock


def test_a_deadline_leaves_what_remains_and_nothing_once_passed() -> None:
    clock = Clock()
    deadline = Deadline(3.0, clock)
    assert deadline.left() == 3.0
    clock.now += 2.5
    assert deadline.left() == 0.5
    clock.now += 60  # a machine so busy that the stage overran: every wait still left is none
    assert deadline.left() == 0.0
