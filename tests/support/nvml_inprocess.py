"""The fake pynvml of tests/support/fakes loaded in-process as `pynvml` for the NVML signals (nvidia-ml-py's own
NVMLError classes and constants, device calls read from a scenario file), with the loops `Nvml` would start kept
instead, so that each test runs them by name."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stallwatch.signals import devices as devices_module
from stallwatch.signals import nvml as nvml_module
from stallwatch.signals import xid as xid_module
from support.harness import gpus
from support.paths import FAKES


class FakeNvml:
    """The fake pynvml loaded as `pynvml`, its scenario file, and the loops Nvml asked `run_every` to start."""

    def __init__(self, path: Path, fake: ModuleType) -> None:
        self.path, self.fake = path, fake
        self.scenario: dict[str, Any] = {}
        self.loops: dict[str, Callable[[], None]] = {}
        self._version = 0

    def update(self, **changes: Any) -> None:
        self.scenario.update(changes)
        self.path.write_text(json.dumps(self.scenario))
        self._version += 1  # a new mtime each time: the fake re-reads the file only when it changes
        os.utime(self.path, ns=(self._version * 10**9, self._version * 10**9))

    def run_every(self, interval: float, action: Callable[[], None], name: str, *_: object, **__: object) -> None:
        self.loops[name] = action

    def run(self, name: str) -> None:
        self.loops[name]()

    def spy(self, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> list[str]:
        """From now, each call of the fake's `names` is noted (by name) in the list returned, then made."""
        called: list[str] = []

        def spying(name: str) -> Callable[..., Any]:
            call = getattr(self.fake, name)

            def spy(*args: Any, **kwargs: Any) -> Any:
                called.append(name)
                return call(*args, **kwargs)
            return spy

        for name in names:
            monkeypatch.setattr(self.fake, name, spying(name))
        return called


def load_fake_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeNvml:
    """The fake as `pynvml` of the NVML signals, with two GPUs of 40 GB held by pid 1234 at 50 %."""
    path = tmp_path / "nvml.json"
    monkeypatch.setenv("STALLWATCH_FAKE_NVML", str(path))
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "pynvml.py")
    assert spec is not None and spec.loader is not None
    fake = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # the fake loads the real module while it is `pynvml`
    spec.loader.exec_module(fake)
    monkeypatch.setattr(nvml_module, "pynvml", fake)
    monkeypatch.setattr(devices_module, "pynvml", fake)
    monkeypatch.setattr(xid_module, "pynvml", fake)
    fake_nvml = FakeNvml(path, fake)
    monkeypatch.setattr(nvml_module, "run_every", fake_nvml.run_every)
    fake_nvml.update(driver="550.54.15", gpus=gpus(2, used=40e9, util=50, processes=[{"pid": 1234, "used": 40e9}]))
    return fake_nvml
