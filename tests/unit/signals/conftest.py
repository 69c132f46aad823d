"""The fake pynvml in-process for the NVML signals' tests (`support.nvml_inprocess`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.nvml_inprocess import FakeNvml, load_fake_nvml


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeNvml:
    return load_fake_nvml(monkeypatch, tmp_path)
