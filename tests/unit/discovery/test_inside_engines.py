"""Engines that are vLLM or SGLang inside (issue 28 item 4), found from the command lines their processes have
(engines-2.md §4, 5, 7, 8): Dynamo workers, Aphrodite, Xinference model processes, KTransformers; each named, its
port (or none) and its children's roles, and the engine inside said in its engine label value."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from stallwatch.discovery.processes import role_name
from stallwatch.engines import ENGINES
from support.watchers import candidate, watcher

DYNAMO_VLLM = ("/usr/bin/python3", "-m", "dynamo.vllm", "--model", "Qwen/Qwen3-0.6B", "--enforce-eager",
               "--disaggregation-mode", "agg")


def _found(tmp_path: Path, argv: tuple[str, ...], environ: bytes = b"") -> list[tuple[str, str, int | None]]:
    """The servers discovered of a process with `argv` (and `environ`): name, engine label value, port."""
    process = candidate(os.getpid(), argv)
    if environ:
        (tmp_path / str(process.pid)).mkdir()
        (tmp_path / str(process.pid) / "environ").write_bytes(environ)
    w = watcher(tmp_path, [process])
    w.refresh()
    return [(s.name, s.engine.name, s.launch.port) for s in w.servers()]


@pytest.mark.parametrize(("argv", "found"), [
    (DYNAMO_VLLM, ("dynamo-vllm-Qwen3-0.6B", "dynamo-vllm", None)),
    (("python3", "-m", "dynamo.sglang", "--model-path", "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "--tp", "1"),
     ("dynamo-sglang-DeepSeek-R1-Distill-Llama-8B", "dynamo-sglang", None)),
    (("python3", "-m", "dynamo.trtllm", "--model-path", "/models/Qwen3-32B-FP8", "--tensor-parallel-size", "2"),
     ("dynamo-trtllm-Qwen3-32B-FP8", "dynamo-trtllm", None)),
    (("/opt/venv/bin/aphrodite", "run", "PygmalionAI/Eleusis-12B"), ("aphrodite-vllm-2242", "aphrodite-vllm", 2242)),
    (("python3", "-m", "aphrodite.entrypoints.openai.api_server", "--model", "m", "--port", "5000"),
     ("aphrodite-vllm-5000", "aphrodite-vllm", 5000)),
    # `setproctitle("Model: {replica_model_uid}")` (xinference/core/model.py:478): psutil reads the title and the NULs
    # it pads the old command line's room with as empty arguments, or (no NULs) splits it at its space.
    (("Model: qwen2.5-instruct-0", *[""] * 40), ("xinference-qwen2.5-instruct-0", "xinference", None)),
    (("Model:", "qwen2.5-instruct-1-0"), ("xinference-qwen2.5-instruct-1-0", "xinference", None)),
    # `kt run` execs SGLang (kt-kernel/python/cli/commands/run.py:636; kt-kernel/README.md:319-333).
    (("/usr/bin/python3", "-m", "sglang.launch_server", "--model", "deepseek-ai/DeepSeek-V3", "--kt-method",
      "AMXINT8", "--kt-weight-path", "/models/DeepSeek-V3-INT8", "--kt-cpuinfer", "64", "--kt-threadpool-count", "2",
      "--kt-num-gpu-experts", "32", "--port", "30000"), ("sglang-30000", "sglang", 30000)),
])
def test_each_is_found_and_says_the_engine_inside(tmp_path: Path, argv: tuple[str, ...],
                                                   found: tuple[str, str, int | None]) -> None:
    assert _found(tmp_path, argv) == [found]


@pytest.mark.parametrize("argv", [
    ("python3", "-m", "dynamo.frontend", "--http-port", "8000"),  # holds no model
    ("python3", "-m", "dynamo.vllm.publisher"),
    ("/usr/local/bin/xinference-local", "--host", "0.0.0.0", "--port", "9997"),  # the API, not a model
    ("/usr/bin/python3", "/usr/local/bin/kt", "run", "deepseek-v3"),  # before its exec
    ("/opt/venv/bin/aphrodite", "run-batch", "-i", "in.jsonl"),
])
def test_their_front_ends_and_tools_are_no_servers(tmp_path: Path, argv: tuple[str, ...]) -> None:
    assert _found(tmp_path, argv) == []


def test_a_dynamo_workers_system_port_is_its_probe(tmp_path: Path) -> None:
    """`DYN_SYSTEM_PORT` turns on the worker's `/health` (off by default): named, listened for and probed there."""
    process = candidate(os.getpid(), DYNAMO_VLLM)
    (tmp_path / str(process.pid)).mkdir()
    (tmp_path / str(process.pid) / "environ").write_bytes(b"DYN_NAMESPACE=dynamo\0DYN_SYSTEM_PORT=8081\0")
    w = watcher(tmp_path, [process])
    w.refresh()
    [server] = w.servers()
    assert (server.name, server.launch.port) == ("dynamo-vllm-8081", 8081)
    assert [t.probe.url for t in server.launch.probes] == ["http://127.0.0.1:8081/health"]


def test_without_a_system_port_a_dynamo_worker_is_probed_nowhere(tmp_path: Path) -> None:
    w = watcher(tmp_path, [candidate(os.getpid(), DYNAMO_VLLM)])
    w.refresh()
    [server] = w.servers()
    assert server.launch.port is None and server.launch.probes == ()


def test_an_xinference_model_process_inside_its_worker_is_the_server(tmp_path: Path) -> None:
    """The worker matches no engine; its model process, a child, is the server."""
    worker = candidate(os.getppid(), ("/usr/local/bin/xinference-local", "--port", "9997"))
    model = dataclasses.replace(candidate(os.getpid(), ("Model: qwen2.5-instruct-0", "", "")), ppid=worker.pid)
    w = watcher(tmp_path, [worker, model])
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("xinference-qwen2.5-instruct-0", os.getpid())]


@pytest.mark.parametrize(("name", "title", "role"), [
    ("dynamo-vllm", "VLLM::EngineCore", "EngineCore"),
    ("dynamo-vllm", "VLLM::Worker_TP1", "Worker_TP1"),
    ("dynamo-sglang", "sglang::scheduler_TP0", "scheduler_TP0"),
    ("aphrodite-vllm", "APHRODITE::EngineCore", "EngineCore"),
    ("aphrodite-vllm", "APHRODITE::Worker_TP3", "Worker_TP3"),
    ("xinference", "VLLM::EngineCore", "EngineCore"),
    ("xinference", "sglang::detokenizer", "detokenizer"),
])
def test_their_childrens_titles_are_the_inner_engines_roles(name: str, title: str, role: str) -> None:
    assert role_name([title], "python3", ENGINES[name].role_title) == role
