"""Naming and forgetting of discovered servers, with the process list handed to the `Watcher` (its `scan` seam):
names unique on the node and stable across restarts, gone servers dropped after `discovery.forget_after`,
configured ones never. The procfs is an empty directory, so placement reads every process as a bare host one
whatever machine runs the test."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stallwatch.config import Config, Discovery, Paths, ServerSpec
from stallwatch.discovery.processes import Candidate
from stallwatch.discovery.watcher import Watcher
from support.clock import Clock

SGLANG = ("python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "30000")


def candidate(pid: int, argv: tuple[str, ...] = SGLANG) -> Candidate:
    return Candidate(pid, 1, psutil.Process(pid).create_time(), argv, " ".join(argv))


def watcher(tmp_path: Path, found: list[Candidate], clock: Clock | None = None, **config: object) -> Watcher:
    base = Config(discovery=Discovery(enabled=True, forget_after=60.0), paths=Paths(procfs=str(tmp_path)))
    return Watcher(dataclasses.replace(base, **config), clock=clock or Clock(), scan=lambda: list(found))


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def sleeper(started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started.append(proc)
    return proc


def test_two_live_servers_on_one_port_get_two_names(tmp_path: Path) -> None:
    w = watcher(tmp_path, [candidate(os.getppid()), candidate(os.getpid())])
    w.refresh()
    assert sorted(s.name for s in w.servers()) == ["sglang-30000", "sglang-30000-2"]
    assert {s.launch.pid for s in w.servers()} == {os.getppid(), os.getpid()}


@pytest.mark.process
def test_a_workload_restarted_keeps_its_name_and_a_new_launch(tmp_path: Path, sleepers: list) -> None:
    first = sleeper(sleepers)
    found = [candidate(first.pid)]
    w = watcher(tmp_path, found)
    w.refresh()
    (server,) = w.servers()
    first.kill()
    first.wait()
    second = sleeper(sleepers)
    found[:] = [candidate(second.pid)]
    w.refresh()
    assert w.servers() == [server] and server.name == "sglang-30000" and server.launch.pid == second.pid


@pytest.mark.process
def test_a_gone_discovered_server_is_forgotten_after_forget_after(tmp_path: Path, sleepers: list) -> None:
    proc = sleeper(sleepers)
    found, clock = [candidate(proc.pid)], Clock()
    w = watcher(tmp_path, found, clock)
    told: list[list[str]] = []
    w.on_change(lambda servers: told.append([s.name for s in servers]))
    w.refresh()
    proc.kill()
    proc.wait()
    found.clear()
    w.refresh()  # gone from now on
    clock.now += 59
    w.refresh()
    assert [s.name for s in w.servers()] == ["sglang-30000"]
    clock.now += 1
    w.refresh()
    assert w.servers() == [] and told[-1] == []


def test_a_configured_server_is_never_forgotten(tmp_path: Path) -> None:
    clock = Clock()
    spec = ServerSpec(engine="sglang", name="kimi")
    w = watcher(tmp_path, [], clock, servers=(spec,), discovery=Discovery(enabled=False, forget_after=1.0))
    w.refresh()
    clock.now += 3600
    w.refresh()
    assert [s.name for s in w.servers()] == ["kimi"] and not w.servers()[0].is_running()
