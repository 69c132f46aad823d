"""The unit tier starts no process: a test that tries (subprocess, fork, posix_spawn) fails, naming what it ran.

The code under test may catch the error a refused start raises, so the test fails at teardown whatever it caught."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    started: list[str] = []

    def refuse(what: str) -> object:
        def refused(*args: object, **kwargs: object) -> None:
            started.append(f"{what}{args[:2]!r}")
            raise PermissionError(f"a unit test starts no process ({what})")
        return refused

    monkeypatch.setattr(subprocess, "_fork_exec", refuse("subprocess"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    yield
    if started:
        pytest.fail(f"a unit test started a process: {started}; it belongs under tests/system", pytrace=False)
