from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import Engine, Exporter


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


def require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed; the README's test command installs it")
    return path


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/fixtures/golden/scrape.prom")
