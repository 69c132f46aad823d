"""`stallwatch` as a process: `diagnose --config.file F NAME` reads the config as `--config.file F diagnose NAME`
does (it was refused with "unrecognized arguments")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

CONFIG = "servers:\n  - name: seed\n    engine: sglang\n    match:\n      cmdline: 'no-such-program-q7'\n"


def _stallwatch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stallwatch", *argv], capture_output=True, text=True, timeout=60)


def test_diagnose_takes_the_config_on_either_side(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text(CONFIG)
    before = _stallwatch(f"--config.file={config}", "diagnose", "seed", "--window=0.2")
    after = _stallwatch("diagnose", "--config.file", str(config), "seed", "--window=0.2")
    for out in (before, after):  # the configured server, not running: down (1), not "no watched server" (2)
        assert out.returncode == 1 and out.stdout.startswith("=== seed ===\nVERDICT: DOWN"), out.stderr
    unconfigured = _stallwatch("diagnose", "seed", "--window=0.2")
    assert unconfigured.returncode == 2 and "no watched server named 'seed'" in unconfigured.stderr


def test_a_bad_config_after_the_sub_command_exits_2_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "bad.yml"
    config.write_text("servers: 3\n")
    for argv in (["check-config", str(config)], ["diagnose", f"--config.file={config}"]):
        out = _stallwatch(*argv)
        assert out.returncode == 2 and f"stallwatch: error: {config}:1: servers" in out.stderr, (argv, out.stderr)
