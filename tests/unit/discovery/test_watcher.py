"""The watcher's names for servers: two on one port get two names; a configured one is never forgotten."""

from __future__ import annotations

import os
from pathlib import Path

from stallwatch.config import Discovery, ServerSpec
from support.clock import Clock
from support.watchers import candidate, watcher


def test_two_live_servers_on_one_port_get_two_names(tmp_path: Path) -> None:
    w = watcher(tmp_path, [candidate(os.getppid()), candidate(os.getpid())])
    w.refresh()
    assert sorted(s.name for s in w.servers()) == ["sglang-30000", "sglang-30000-2"]
    assert {s.launch.pid for s in w.servers()} == {os.getppid(), os.getpid()}


def test_a_configured_server_is_never_forgotten(tmp_path: Path) -> None:
    clock = Clock()
    spec = ServerSpec(engine="sglang", name="kimi")
    w = watcher(tmp_path, [], clock, servers=(spec,), discovery=Discovery(enabled=False, forget_after=1.0))
    w.refresh()
    clock.now += 3600
    w.refresh()
    assert [s.name for s in w.servers()] == ["kimi"] and not w.servers()[0].is_running()
