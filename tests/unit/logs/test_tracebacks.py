"""A traceback is judged by how it ends: the real logs' stops (Ctrl-C and SIGTERM during a load, their tracebacks
ending in KeyboardInterrupt) are stops, and one that ends in an error is a failure; the end may come in a later
block, and a traceback never closed is a failure once its process is gone."""

from __future__ import annotations

import re

import pytest

from stallwatch.engines import ENGINES
from stallwatch.logs import tracebacks
from stallwatch.logs.interpret import LogInterpreter
from support.corpus import LOGS

VLLM, NO_PREFIX = re.compile(ENGINES["vllm"].line_prefix), re.compile(b"")
# From tests/fixtures/logs/vllm-0.22.0-ctrl-c-during-load.log and vllm-0.10.2-free-memory-startup-crash.log.
STOP = (b"(APIServer pid=13078) Traceback (most recent call last):\n"
        b'(APIServer pid=13078)   File "/usr/lib/python3.12/asyncio/runners.py", line 118, in run\n'
        b"(APIServer pid=13078)     raise KeyboardInterrupt()\n"
        b"(APIServer pid=13078) KeyboardInterrupt\n")
CRASH = (b"(EngineCore_DP0 pid=18) ERROR 09-22 10:01:02 [core.py:718] Traceback (most recent call last):\n"
         b'(EngineCore_DP0 pid=18) ERROR 09-22 10:01:02 [core.py:718]   File "/vllm/v1/worker/gpu_worker.py", line 1\n'
         b"(EngineCore_DP0 pid=18) ERROR 09-22 10:01:02 [core.py:718] ValueError: Free memory on device (16.01/93.0 "
         b"GiB) on startup is less than desired GPU memory utilization\n")


def _read(name: str, alive: bool = False) -> tuple[str, dict[str, int]]:
    interpreter = LogInterpreter(ENGINES[name.split("-")[0]])
    interpreter.process_started(0.0)
    for line in (LOGS / name).read_bytes().splitlines(keepends=True):
        interpreter.feed(line)
    if not alive:
        interpreter.process_gone()
    snap = interpreter.snapshot()
    return snap.phase, snap.events


@pytest.mark.parametrize("name", ["vllm-0.22.0-ctrl-c-during-load.log",
                                  "vllm-0.10.0-v0-sigterm-during-engine-start.log",
                                  "vllm-0.21.0-sigterm-during-hf-fetch-colored-traceback.log"])
def test_a_stop_during_a_load_is_stopped_with_no_fatal(name: str) -> None:
    """Ctrl-C during a download (`KeyboardInterrupt`), SIGTERM turned into `KeyboardInterrupt: terminated` by
    vLLM's handler, coloured by Python 3.14: each launch ends `stopped`, counting no fatal."""
    phase, events = _read(name)
    assert (phase, events["fatal"]) == ("stopped", 0)


def test_a_traceback_that_ends_in_an_error_is_a_failure() -> None:
    """The counter-test: a real startup crash's traceback, ending in ValueError, still fails the launch."""
    phase, events = _read("vllm-0.10.2-free-memory-startup-crash.log")
    assert phase == "failed" and events["fatal"] >= 1


@pytest.mark.parametrize(("block", "stop"), [(STOP, True), (CRASH, False)])
def test_judged_by_the_exception_past_each_lines_prefix(block: bytes, stop: bool) -> None:
    first = block.index(b"\n") + 1
    verdict = tracebacks.judge(block, first, tracebacks.Open(1, False, True), VLLM)
    assert verdict == tracebacks.Judged(stop, len(block))


@pytest.mark.parametrize("cut", [1, 2])
def test_an_end_in_a_later_block_is_waited_for(cut: int) -> None:
    """The follower hands lines over as they come: the traceback is judged when its last line arrives."""
    interpreter = LogInterpreter(ENGINES["vllm"])
    lines = CRASH.splitlines(keepends=True)
    interpreter.feed(b"".join(lines[:cut]))
    assert interpreter.snapshot().events["fatal"] == 0  # not ended yet
    interpreter.feed(b"".join(lines[cut:]))
    assert interpreter.snapshot().events["fatal"] == 1


def test_a_traceback_never_ended_is_a_failure_once_its_process_is_gone() -> None:
    interpreter = LogInterpreter(ENGINES["vllm"])
    interpreter.feed(CRASH.splitlines(keepends=True)[0])
    interpreter.process_gone()
    snap = interpreter.snapshot()
    assert (snap.phase, snap.events["fatal"]) == ("failed", 1)


def test_a_traceback_held_open_is_bounded() -> None:
    """A traceback of endless frames is judged after MAX_LINES of them, not held for good."""
    interpreter = LogInterpreter(ENGINES["vllm"])
    frames = b'  File "x.py", line 1, in f\n' * tracebacks.MAX_LINES
    interpreter.feed(b"Traceback (most recent call last):\n" + frames[: len(frames) // 2])
    assert interpreter.snapshot().events["fatal"] == 0  # still open
    interpreter.feed(frames[len(frames) // 2:] + frames)
    assert interpreter.snapshot().events["fatal"] == 1


def test_a_chained_traceback_is_one_until_its_end() -> None:
    """`During handling of the above exception` joins the next traceback to it; another one without it ends it."""
    chained = (b"Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyboardInterrupt\n\n"
               b"During handling of the above exception, another exception occurred:\n\n"
               b"Traceback (most recent call last):\n  File \"b.py\", line 2, in g\nSystemExit: 15\n")
    assert tracebacks.judge(chained, chained.index(b"\n") + 1, tracebacks.Open(1, False, True), NO_PREFIX).stop
    two = b"Traceback (most recent call last):\n  File \"a.py\", line 1\nTraceback (most recent call last):\n"
    assert tracebacks.judge(two, two.index(b"\n") + 1, tracebacks.Open(1, False, True), NO_PREFIX) == tracebacks.Judged(
        False, two.index(b"Traceback", 5))
