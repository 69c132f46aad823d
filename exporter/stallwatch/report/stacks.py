"""Python stacks of a server's processes from `py-spy dump`, grouped where identical (TP ranks), with the frames
that wait marked. Another user's process decides how much py-spy prints (thousands of threads, frames deep): at most
MAX_OUTPUT_BYTES of it are read, and MAX_THREADS threads of MAX_FRAMES frames each are kept (py-spy prints the main
thread first, and each thread's innermost frame, where it waits, first)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stallwatch.report.model import Frame, ProcessInfo, StackGroup, ThreadStack
from stallwatch.text import terminal_safe

PYSPY_TIMEOUT = 10.0
MAX_OUTPUT_BYTES = 256 << 10
MAX_THREADS = 64
MAX_FRAMES = 64
# Frames that show a process waiting: collectives, graph capture, queues, locks, sockets, sleeps.
WAIT_FRAME = re.compile(
    r"nccl|all_reduce|all_gather|reduce_scatter|broadcast|barrier|capture|recv|(^|_)get$|acquire|wait|sleep"
    r"|select|poll|join|lock", re.IGNORECASE)
THREAD_LINE = re.compile(r'^Thread (\S+) \(([^)]*)\): "(.*)"\s*$')
FRAME_LINE = re.compile(r"^ {4}(\S.*?) \((.*)\)\s*$")


def pyspy_binary() -> str | None:
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"  # a venv's bin, not on PATH
    return str(beside) if os.access(beside, os.X_OK) else None


def dump(pid: int, binary: str | None, timeout: float = PYSPY_TIMEOUT) -> tuple[list[ThreadStack], str]:
    """The Python threads of `pid` from `py-spy dump` (killed after `timeout` seconds), or why there are none."""
    if binary is None:
        return [], "py-spy is not installed"
    try:
        status, out = _run([binary, "dump", "--pid", str(pid)], timeout)
    except OSError as exc:
        return [], f"py-spy could not run: {exc.strerror or exc}"
    if status is None:
        return [], f"py-spy timed out after {timeout:.1f}s"
    text = out.decode("utf-8", "replace")
    if status != 0 and len(out) < MAX_OUTPUT_BYTES:  # ended by us at the bound: what it printed is good
        lines = text.strip().splitlines()
        return [], "py-spy failed: " + terminal_safe(lines[-1] if lines else f"exit {status}")
    return parse_dump(text), ""


def _run(argv: list[str], timeout: float) -> tuple[int | None, bytes]:
    """The exit status of `argv` (None: killed after `timeout` seconds) and the first MAX_OUTPUT_BYTES of its stdout
    and stderr; it is killed once that much came."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()

    timer = threading.Timer(timeout, expire)
    timer.name = "py-spy deadline"
    timer.start()
    try:
        assert proc.stdout is not None
        with proc.stdout:
            out = proc.stdout.read(MAX_OUTPUT_BYTES)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
        status = proc.wait()
    return (None if expired.is_set() else status), out


def parse_dump(text: str) -> list[ThreadStack]:
    """Threads and frames of py-spy's output, at most MAX_THREADS of MAX_FRAMES each; names, which their process
    chose, without control characters."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        thread = THREAD_LINE.match(line)
        if thread:
            if len(threads) == MAX_THREADS:
                break
            threads.append(ThreadStack(terminal_safe(thread.group(3)), terminal_safe(thread.group(2)), []))
            continue
        frame = FRAME_LINE.match(line)
        if frame and threads and len(threads[-1].frames) < MAX_FRAMES:
            function = terminal_safe(frame.group(1))
            threads[-1].frames.append(Frame(function, terminal_safe(frame.group(2)), bool(WAIT_FRAME.search(function))))
    return threads


def stacks(processes: list[ProcessInfo], timeout: float = PYSPY_TIMEOUT) -> list[StackGroup]:
    """The processes' stacks, one `py-spy dump` each (in parallel), each cut after `timeout` seconds."""
    binary = pyspy_binary()
    live = [p for p in processes if p.state != "Z"]
    with ThreadPoolExecutor(max_workers=min(16, len(live) or 1), thread_name_prefix="py-spy") as pool:
        dumps = list(pool.map(lambda p: dump(p.pid, binary, timeout), live))
    groups: dict[str, StackGroup] = {}
    for proc, (threads, error) in zip(live, dumps, strict=True):
        # By thread names and frames: a rank caught `active` for a moment still joins its idle peers.
        key = json.dumps([[t.name, [dataclasses.astuple(f) for f in t.frames]] for t in threads]) + error
        group = groups.setdefault(key, StackGroup([], [], threads, error))
        group.roles.append(proc.role)
        group.pids.append(proc.pid)
    return list(groups.values())


def wait_frame(group: StackGroup) -> str | None:
    """The innermost waiting frame of a group's main thread (else its first thread)."""
    threads = sorted(group.threads, key=lambda t: t.name != "MainThread")
    for thread in threads[:1]:
        for frame in thread.frames:
            if frame.wait:
                return frame.function
    return None
