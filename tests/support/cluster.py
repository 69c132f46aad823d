"""Nodes of a multi-node deployment on one machine, for real: each node is its own PID and mount namespace (a
`/proc` of its own, so the exporter on it sees only that node's processes, with that node's pids) and its own
network namespace (a veth pair in 198.18.0.0/15, `sandbox.Netns`), with its name as its hostname (a UTS namespace of
its own). Processes join a node through `prefix()`
(`nsenter` into the node's init). Everything in a node ends with it: killing its init ends its PID namespace.
`Cluster`: nodes, each with its exporter, one Prometheus over them and Alertmanager with the shipped routes.
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

from support.harness import Engine, Exporter, gpus, poll
from support.sandbox import Netns, require_root
from support.stack import Webhook, alertmanager, prometheus


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
            # `--mount-proc`: a /proc of the new PID namespace; `sleep` is its init (pid 1) and holds it open. Its
            # own hostname too, as a node has (a key made on one node names it: a PD group by its router).
            self._holder = subprocess.Popen([*self.netns.exec_prefix(), "unshare", "--pid", "--mount", "--uts",
                                             "--fork", "--mount-proc", "--kill-child", "sh", "-c",
                                             f"hostname {name} && exec sleep infinity"],
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
        return ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "-u", "--"]

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


NODE_CONFIG = ("discovery: {enabled: true, interval: 1s}\n"
               "defaults:\n  stall: {gpu_memory_bytes: 70e9, log_stale: 12s}\n"
               "  probe: {timeout: 1s, interval: 1s}\n"
               "logs: {poll_interval: 0.5s}\n"
               "engine_metrics: {interval: 1s, timeout: 1s}\n")


NODE_LOG_STALE = 12.0  # seconds, as in NODE_CONFIG: at least the scaled idle window (5m -> 10 s)


class Cluster:
    """Nodes, each with an exporter; Prometheus over all of them; Alertmanager with the shipped routes."""

    def __init__(self, stack: contextlib.ExitStack, tmp: Path, daemons: list, count: int) -> None:
        self.stack, self.tmp = stack, tmp
        self.nodes = [stack.enter_context(contextlib.closing(Node(tmp, f"node{i}"))) for i in range(count)]
        self.gpus = [gpus(9, used=76e9, util=0) for _ in self.nodes]
        self.exporters = [self._exporter(node, nvml) for node, nvml in zip(self.nodes, self.gpus, strict=True)]
        self.hook = Webhook()
        am_port = alertmanager(daemons, tmp, self.hook, shipped=True)
        self.query = prometheus(daemons, tmp, am_port, [self.instance(i) for i in range(count)])
        poll(lambda: len(self.query('up{job="stallwatch"} == 1')) == count, timeout=30, what="every node scraped")

    def _exporter(self, node: Node, nvml: list[dict]) -> Exporter:
        e = Exporter(node.tmp, config=NODE_CONFIG, nvml={"gpus": nvml}, listen_host="0.0.0.0", prefix=node.prefix(),
                     url_host=node.address)
        self.stack.callback(e.stop)
        return e

    def instance(self, i: int) -> str:
        return f"{self.nodes[i].address}:{self.exporters[i].port}"

    def engine(self, i: int, *args: object, **kwargs: object) -> Engine:
        sim = Engine(self.nodes[i].tmp, *args, prefix=self.nodes[i].prefix(), **kwargs)  # type: ignore[arg-type]
        self.stack.callback(sim.stop)
        return sim

    def hold(self, i: int, titles: list[str], first_gpu: int = 0) -> list[psutil.Process]:
        """The processes titled `titles` on node `i` hold 75 GB each on GPUs `first_gpu`.. (pids as the node's
        NVML sees them: its own PID namespace's)."""
        def each() -> list[psutil.Process] | None:
            found = [self.nodes[i].titled(title) for title in titles]
            return [procs[0] for procs in found] if all(found) else None

        found = poll(each, timeout=30, what=f"{titles} on node {i}")
        for gpu, proc in enumerate(found, start=first_gpu):
            self.gpus[i][gpu]["processes"] = [{"pid": ns_pid(proc.pid), "used": 75e9}]
        self.exporters[i].nvml.update(gpus=self.gpus[i])
        return found

    def firing(self) -> list[dict]:
        """Alerts past their `for`: what pages or tickets. A pending one (a probe that timed out once while the
        node's 2 cores start 40 engine processes) is by design not yet anything."""
        return self.query('ALERTS{alertstate="firing"}')
