"""py-spy dumps parsed: each thread's frames, and which of them wait."""

from __future__ import annotations

from stallwatch.report import stacks


def test_parse_dump_marks_waits() -> None:
    text = ('Process 7: python -m sglang.launch_server\nPython v3.11.2 (/usr/bin/python3.11)\n\n'
            'Thread 7 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:2050)\n'
            '    forward (model.py:10)\nThread 9 (active): "Thread-1"\n    get (queue.py:171)\n')
    threads = stacks.parse_dump(text)
    assert [(t.name, t.status) for t in threads] == [("MainThread", "idle"), ("Thread-1", "active")]
    assert [f.wait for f in threads[0].frames] == [True, False] and threads[1].frames[0].wait
