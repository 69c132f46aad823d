"""The watcher's names for servers: two on one port get two names; a configured one is never forgotten."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

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


WRAPPERS = [
    ("gdb", "--args", "/opt/llama.cpp/build/bin/llama-server", "-m", "m.gguf", "--port", "8081"),
    ("strace", "-f", "-o", "/tmp/trace", "/opt/llama.cpp/build/bin/llama-server", "--port", "8081"),
    ("perf", "record", "-g", "--", "llama-server", "--port", "8081"),
    ("valgrind", "--tool=memcheck", "llama-server"),
    ("vim", "/opt/llama.cpp/build/bin/llama-server"),
    ("python3", "launch.py", "--server", "/opt/llama.cpp/build/bin/llama-server"),
    ("bash", "-c", "exec python3 -m vllm.entrypoints.openai.api_server --port 8001"),
    ("tmux", "new", "-d", "vllm serve m"),
]


@pytest.mark.parametrize("argv", WRAPPERS, ids=[w[0] for w in WRAPPERS])
def test_a_tool_given_a_servers_path_is_not_discovered(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """A debugger, tracer, profiler, editor, launcher or shell whose arguments name an engine's binary or module runs
    itself: discovered, it would read as a server on a port it never opens and fire InferenceServerDown when the
    tool exits (issue 27 item 3)."""
    w = watcher(tmp_path, [candidate(os.getpid(), argv)])
    w.refresh()
    assert w.servers() == []


def test_the_server_a_launcher_starts_is_discovered_not_the_launcher(tmp_path: Path) -> None:
    """A launcher given the path forks the real server: the server, its child, is the root discovered (the launcher
    used to match and hide its child as a forked worker of itself)."""
    launcher = candidate(os.getppid(), ("gdb", "--args", "/opt/bin/llama-server", "--port", "8081"))
    server = candidate(os.getpid(), ("/opt/bin/llama-server", "--port", "8081"))
    w = watcher(tmp_path, [launcher, dataclasses.replace(server, ppid=launcher.pid)])
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("llamacpp-8081", os.getpid())]
