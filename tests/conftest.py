"""Fixtures for the exporter and simulated engines as processes, the test kinds (markers) and `--update-golden`.

Kinds, so that a unit run takes seconds (`pytest -m "not process"`):
- `process`: runs the exporter, a simulated engine or another program (promtool, journalctl, openssl) as a process;
  given to every test that takes a fixture of PROCESS_FIXTURES, and to `root` and `e2e` tests.
- `root`: needs root to make network namespaces, veth pairs and cgroups (the pod, container and unit sandboxes);
  skipped, saying why, elsewhere.
- `e2e`: through real Prometheus and Alertmanager binaries.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support.harness import Engine, Exporter
from support.sandbox import require_root
from support.stack import Daemon

PROCESS_FIXTURES = {"exporter", "engine", "rig", "pki"}  # `rig`: test_load's exporter; `pki`: openssl


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Callable[..., Exporter]]:
    started: list[Exporter] = []

    def start(**kwargs: object) -> Exporter:
        e = Exporter(tmp_path, **kwargs)  # type: ignore[arg-type]
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    started: list[Engine] = []

    def start(*args: object, **kwargs: object) -> Engine:
        e = Engine(tmp_path, *args, **kwargs)  # type: ignore[arg-type]
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


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
        kinds = {mark.name for mark in item.iter_markers()}
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or kinds & {"root", "e2e"}:
            item.add_marker(pytest.mark.process)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("root") is not None:
        require_root()
