"""Python stacks of a server's processes from `py-spy dump`, grouped where identical (TP ranks), with the frames
that wait marked."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stallwatch.report.model import Frame, ProcessInfo, StackGroup, ThreadStack
from stallwatch.text import printable

PYSPY_TIMEOUT = 10.0
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


def dump(pid: int, binary: str | None) -> tuple[list[ThreadStack], str]:
    """The Python threads of `pid` from `py-spy dump`, or why there are none."""
    if binary is None:
        return [], "py-spy is not installed"
    try:
        out = subprocess.run([binary, "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=PYSPY_TIMEOUT, errors="replace")
    except subprocess.TimeoutExpired:
        return [], f"py-spy timed out after {PYSPY_TIMEOUT:.0f}s"
    except OSError as exc:
        return [], f"py-spy could not run: {exc.strerror or exc}"
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        return [], "py-spy failed: " + (lines[-1] if lines else f"exit {out.returncode}")
    return parse_dump(out.stdout), ""


def parse_dump(text: str) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        thread = THREAD_LINE.match(line)
        if thread:
            threads.append(ThreadStack(printable(thread.group(3)), thread.group(2), []))
            continue
        frame = FRAME_LINE.match(line)
        if frame and threads:
            function = frame.group(1)
            threads[-1].frames.append(Frame(function, frame.group(2), bool(WAIT_FRAME.search(function))))
    return threads


def stacks(processes: list[ProcessInfo]) -> list[StackGroup]:
    binary = pyspy_binary()
    live = [p for p in processes if p.state != "Z"]
    with ThreadPoolExecutor(max_workers=min(16, len(live) or 1)) as pool:
        dumps = list(pool.map(lambda p: dump(p.pid, binary), live))
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
