"""Nodes of a multi-node deployment on one machine, for real: each node is its own PID and mount namespace (a
`/proc` of its own, so the exporter on it sees only that node's processes, with that node's pids) and its own
network namespace (a veth pair in 198.18.0.0/15, `sandbox.Netns`). Processes join a node through `prefix()`
(`nsenter` into the node's init). Everything in a node ends with it: killing its init ends its PID namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from support.harness import poll
from support.sandbox import Netns, require_root


def require_nodes() -> None:
    """Skip unless we are root with network namespaces, cgroups, `unshare` and `nsenter`."""
    require_root()
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            pytest.skip(f"multi-node tests need util-linux's `{tool}`")


class Node:
    """One node: `address` is where the other nodes and Prometheus reach it; `tmp` its own directory (its fake
    NVML, its exporter's files)."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.name = name
        self.tmp = tmp / name
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.netns = Netns().create()
        self.address = self.netns.address
        try:
            # `--mount-proc`: a /proc of the new PID namespace; `sleep` is its init (pid 1) and holds it open.
            self._holder = subprocess.Popen([*self.netns.exec_prefix(), "unshare", "--pid", "--mount", "--fork",
                                             "--mount-proc", "--kill-child", "sleep", "infinity"],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.init_pid = poll(self._init, timeout=10, what=f"node {name}'s init")
        except BaseException:
            self.close()
            raise

    def _init(self) -> int | None:
        for child in psutil.Process(self._holder.pid).children():
            with contextlib.suppress(psutil.Error):
                if child.name() == "sleep" and ns_pid(child.pid) == 1:
                    return child.pid
        return None

    def prefix(self) -> list[str]:
        """Run a command inside the node: its network, PID and mount namespaces (a fork of `nsenter`)."""
        return ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "--"]

    def processes(self) -> list[psutil.Process]:
        """The node's processes (but its init) as the host sees them: those in its PID namespace (`nsenter` makes
        them children of itself, outside the node)."""
        try:
            node = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except OSError:
            return []
        out = []
        for proc in psutil.process_iter():
            with contextlib.suppress(OSError):
                if proc.pid != self.init_pid and os.readlink(f"/proc/{proc.pid}/ns/pid") == node:
                    out.append(proc)
        return out

    def titled(self, title: str) -> list[psutil.Process]:
        out = []
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                if proc.cmdline() and proc.cmdline()[0] == title:
                    out.append(proc)
        return out

    def close(self) -> None:
        holder = getattr(self, "_holder", None)
        if holder is not None and holder.poll() is None:
            holder.send_signal(signal.SIGKILL)  # --kill-child: the init goes, and with it the PID namespace
            holder.wait(10)
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        self.netns.close()


def ns_pid(host_pid: int) -> int:
    """The pid a process has in its own (innermost) PID namespace, from the `NSpid` line of its status."""
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise LookupError(f"no NSpid for {host_pid}")
