"""The status page's log tail: the last lines, bounded, rewrites collapsed."""

from __future__ import annotations

import re

from stallwatch.logs.tail import MAX_LINE_BYTES, LogTail


# -- the pieces --------------------------------------------------------------------------------------------------
def test_log_tail_keeps_the_last_lines_and_collapses_rewrites() -> None:
    tail = LogTail()
    tail(b"one\ntwo\n")
    tail(b"\rbar 1/3\rbar 2/3\rbar 3/3\n\x1b[32mthree\x1b[0m\n")
    assert tail.lines() == ["one", "two", "bar 3/3", "three"]
    tail(b"x" * (3 * MAX_LINE_BYTES) + b"\n")
    assert tail.lines()[-1] == "x" * MAX_LINE_BYTES
    assert tail.lines(2)[0] == "three"
    tail(b"four\rfive\r\n")  # a rewrite within one line; `\r\n` ends it
    assert tail.lines(2) == ["x" * MAX_LINE_BYTES, "five"]


def test_log_tail_is_bounded_and_drops_the_cut_line() -> None:
    tail = LogTail()
    for i in range(20_000):
        tail(f"line {i:05d} {'y' * 20}\n".encode())
    assert len(tail._data) <= 2 * LogTail.KEEP_BYTES
    lines = tail.lines(100_000)
    assert lines[-1].startswith("line 19999") and all(re.fullmatch(r"line \d{5} y{20}", x) for x in lines)


def test_log_tail_of_a_100_mb_line_without_newline_stays_small() -> None:
    tail = LogTail()
    chunk = b"z" * (1 << 20)
    for _ in range(100):
        tail(chunk)
    assert len(tail._data) <= 2 * LogTail.KEEP_BYTES
    assert tail.lines() == []  # only a cut piece of one line: nothing whole to show
