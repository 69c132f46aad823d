"""py-spy as a process (a stand-in script): a missing one is reported per process, and a huge dump is read bounded
and kept small."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from stallwatch.report import stacks


def test_missing_pyspy_is_reported_per_process() -> None:
    threads, error = stacks.dump(os.getpid(), None)
    assert threads == [] and error == "py-spy is not installed"
    threads, error = stacks.dump(os.getpid(), "/nonexistent/py-spy")
    assert threads == [] and error.startswith("py-spy could not run")


@pytest.mark.parametrize("frames", [900, 5])
def test_a_huge_pyspy_dump_is_read_bounded_and_kept_small(tmp_path: Path, frames: int) -> None:
    """300 threads of 900 frames made a 21 MB page; the names carried escape sequences."""
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!{sys.executable}\nimport sys\nout = sys.stdout.buffer\n"
                    "for t in range(300):\n"
                    "    out.write(b'Thread %d (idle): \"evil\\x1b]0;title\\x07%d\"\\n' % (t, t))\n"
                    f"    out.write(b'    wait (x.py:1)\\n' * {frames})\n")
    fake.chmod(0o755)
    threads, error = stacks.dump(os.getpid(), str(fake))
    assert error == ""
    if frames > stacks.MAX_FRAMES:  # the first 256 KiB hold a few threads, each cut to its innermost frames
        assert 0 < len(threads) < stacks.MAX_THREADS
        assert all(len(t.frames) == stacks.MAX_FRAMES and t.frames[0].wait for t in threads)
    else:
        assert len(threads) == stacks.MAX_THREADS and all(len(t.frames) == frames for t in threads)
    assert threads[0].name == "evil\\x1b]0;title\\x070"
