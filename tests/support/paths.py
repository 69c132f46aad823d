"""Where the repository's parts are."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "support" / "fakes"  # a directory put first on PYTHONPATH: its `pynvml` is the fake
SIM_PKGS = ROOT / "tests" / "sim" / "pkgs"
SIM_BIN = ROOT / "tests" / "sim" / "bin"
