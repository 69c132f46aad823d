"""Ollama's runners' loops (`Engine.runner_loops`): each runner's port from its command line as Ollama starts it
(`llm/llama_server.go:336-378` at fb307609: `--port <random> --host 127.0.0.1`), nothing else taken for one."""

from __future__ import annotations

import pytest

from stallwatch.engines import ENGINES
from stallwatch.signals.runner_loops import runner_port

SPEC = ENGINES["ollama"].runner_loops
RUNNER = ["/usr/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/sha256-6a0746a1ec1a", "--port",
          "40123", "--host", "127.0.0.1", "--no-webui", "--offline"]


def test_a_runner_is_asked_for_its_slots_on_its_port() -> None:
    assert SPEC is not None and (SPEC.role, SPEC.path) == ("runner", "/slots")
    assert runner_port(RUNNER, SPEC) == 40123
    assert runner_port(["ollama", "runner", "--model", "/m", "--port=38117"], SPEC) == 38117


@pytest.mark.parametrize("argv", [
    ["/usr/lib/ollama/llama-server", "--model", "/m"],  # no port: nothing to ask
    [*RUNNER[:3], "--port"],  # the flag without its value
    [*RUNNER[:3], "--port", "0"], [*RUNNER[:3], "--port", "70000"], [*RUNNER[:3], "--port", "\uff18\uff10\uff18\uff10"],
    [*RUNNER[:3], "--port", "40123; rm"], [*RUNNER[:3], "--port=-1"],
])
def test_a_command_line_without_a_port_is_no_runner_to_ask(argv: list[str]) -> None:
    assert SPEC is not None
    assert runner_port(argv, SPEC) is None
