"""Where a Python traceback in a log ends, and whether it is a stop: a traceback is judged by the exception that
ends it, not by its first line. Python prints (`traceback.format_exception`): `Traceback (most recent call last):`,
its frames indented, then the exception, `Name: message` or `Name`, at the line start; a chained one adds a blank
line, `During handling of the above exception, another exception occurred:` (or `The above exception was the
direct cause of the following exception:`), a blank line and the next traceback. An engine's own prefix
(`Engine.line_prefix`: vLLM's `(EngineCore_DP0 pid=7) ERROR 11-13 09:22:27 [core.py:710] ` on every line of one)
may come before each line."""

from __future__ import annotations

import re
from typing import NamedTuple

CHAINED = (b"During handling of the above exception", b"The above exception was the direct cause")
START = b"Traceback (most recent call last)"
# KeyboardInterrupt is SIGINT (Ctrl-C), or SIGTERM where the engine's handler raises it (vLLM's API server:
# `raise KeyboardInterrupt("terminated")`, `entrypoints/openai/api_server.py`): the server was asked to stop.
STOP_EXCEPTIONS = re.compile(rb"KeyboardInterrupt(?::|$)")
LINE_END = re.compile(rb"[\r\n]")  # as the follower hands lines over: `\r` ends one too
MAX_LINES = 1000  # a traceback held open longer than this many lines is judged as it stands: a failure


class Open(NamedTuple):
    """A traceback whose end is not read yet."""

    lines: int  # its lines read so far
    chained: bool  # the last of them said that another traceback follows
    count_events: bool  # what the block that began it said of counting


class Judged(NamedTuple):
    stop: bool  # it ended in a stop's exception
    end: int  # the offset after its last line in the block


def judge(block: bytes, pos: int, state: Open, prefix: re.Pattern[bytes]) -> Judged | Open:
    """Read the traceback on from `pos` (a line start in `block`), each line past the engine's `prefix`: how it
    ends, or how far it got by the block's end. A new traceback that no chain line announced ends the one before
    without an exception: a failure."""
    lines, chained, size = state.lines, state.chained, len(block)
    while pos < size:
        if lines >= MAX_LINES:
            return Judged(False, pos)
        found = LINE_END.search(block, pos)
        end = size if found is None else found.start()
        found = prefix.match(block, pos, end)
        body = pos if found is None else found.end()
        text = block[body:min(end, body + 64)]
        lines += 1
        if not text.strip() or text[:1] in b" \t":
            pos = end + 1
            continue
        if text.startswith(CHAINED):
            chained, pos = True, end + 1
            continue
        if text.startswith(START):
            if not chained:
                return Judged(False, pos)
            chained, pos = False, end + 1
            continue
        return Judged(STOP_EXCEPTIONS.match(text) is not None, end + 1)
    return Open(lines, chained, state.count_events)
