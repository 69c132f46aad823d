"""Processes that run as an engine's program does (`stallwatch.discovery.processes.invocation`: the script a Python
interpreter is given, named like the engine's command) and only do what they are told: what discovery sees of an
engine, without one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SLEEP = "import time\ntime.sleep(600)\n"
# The system's interpreter, which `nobody` can run in a user namespace of its own too (not one under root's home).
SYSTEM_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def posing_as(directory: Path, command: str, code: str = SLEEP, python: str = sys.executable) -> list[str]:
    """`[python, directory/command]`: a script named `command` (`sglang` for `sglang serve ...`) that runs `code`,
    readable by every user when `directory` is."""
    path = directory / command
    path.write_text(code)
    path.chmod(0o755)
    return [python, str(path)]
