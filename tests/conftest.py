"""Fixtures for the exporter and simulated engines as processes, the test kinds (markers) and `--update-golden`.

The folder says the kind (`pytest tests/unit` is the fast tier, `pytest -m "not process"` the same by marker):
- `unit/`: mirrors `exporter/stallwatch/`; no process, no root. A unit test that takes a fixture of
  PROCESS_FIXTURES or is marked `process`, `root` or `e2e` is a collection error, and one that starts a process
  fails (tests/unit/conftest.py).
- `system/`: `process`: runs the exporter, a simulated engine or another program (journalctl, openssl) as a process.
- `root/`: `process` and `root`: needs root to make network namespaces, veth pairs and cgroups (the pod, container
  and unit sandboxes, the nodes of support.cluster); skipped, saying why, elsewhere.
- `e2e/`: `process` and `e2e`: through real Prometheus, Alertmanager and Chromium.
- `shipped/`: what ships beside the package (rules, dashboard, manifests, docs, the layers); a test there that runs
  promtool or another program is marked `process` itself.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from support.harness import Engine, Exporter, Ollama
from support.llamacpp import LlamaServer, require_llama_server, tiny_model
from support.paths import ROOT
from support.sandbox import require_root
from support.stack import Daemon

# `rig`: system/test_load.py; `pki`: openssl; `llama`: llama.cpp's own llama-server
PROCESS_FIXTURES = {"exporter", "engine", "ollama", "llama", "rig", "pki", "daemons"}
FOLDER_KINDS = {"unit": (), "system": ("process",), "root": ("process", "root"), "e2e": ("process", "e2e"),
                "shipped": ()}
RUNS_THINGS = {"process", "root", "e2e"}
T = TypeVar("T")


def _processes(make: Callable[..., T]) -> Iterator[Callable[..., T]]:
    """A fixture's starter of processes (`make`), each stopped after the test."""
    started: list[T] = []

    def start(*args: object, **kwargs: object) -> T:
        made = make(*args, **kwargs)
        started.append(made)
        return made

    yield start
    for made in started:
        made.stop()


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Callable[..., Exporter]]:
    yield from _processes(functools.partial(Exporter, tmp_path))


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    yield from _processes(functools.partial(Engine, tmp_path))


@pytest.fixture
def ollama(tmp_path: Path) -> Iterator[Callable[..., Ollama]]:
    """Starts the simulated `ollama serve` (support.harness.Ollama)."""
    yield from _processes(functools.partial(Ollama, tmp_path))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model the real llama-server serves (support.llamacpp), written once per run."""
    require_llama_server()
    return tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama.gguf")


@pytest.fixture
def llama(tiny_llama: Path, tmp_path: Path) -> Iterator[Callable[..., LlamaServer]]:
    """Starts llama.cpp's own llama-server (support.llamacpp.LlamaServer) on the tiny model, logging to
    tmp_path/llama-server.log unless told otherwise; killed after the test."""
    started: list[LlamaServer] = []

    def start(**kwargs: object) -> LlamaServer:
        kwargs.setdefault("log", tmp_path / "llama-server.log")
        server = LlamaServer(kwargs.pop("model", tiny_llama), **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Prometheus and Alertmanager processes (support.stack), stopped after the test."""
    started: list[Daemon] = []
    yield started
    for d in reversed(started):
        d.stop()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory under /tmp that `nobody` owns (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="stallwatch-hardening-"))
    os.chown(path, 65534, 65534)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/fixtures/golden/scrape.prom")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(ROOT / "tests").parts[0]
        kinds = {mark.name for mark in item.iter_markers()}
        fixtures = PROCESS_FIXTURES & set(getattr(item, "fixturenames", ()))
        if folder == "unit" and (kinds & RUNS_THINGS or fixtures):
            raise pytest.UsageError(f"{item.nodeid} is a unit test that runs things ({sorted(kinds & RUNS_THINGS)}, "
                                    f"{sorted(fixtures)}): it belongs under tests/system, tests/root or tests/e2e")
        for kind in FOLDER_KINDS.get(folder, ()):
            item.add_marker(kind)
        if fixtures or kinds & {"root", "e2e"}:
            item.add_marker(pytest.mark.process)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is not None:
        require_root()
