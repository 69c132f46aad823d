"""The simulated engines' module (tests/sim/pkgs/enginesim.py) in-process, for tests that build its pages and lines
without running it."""

from __future__ import annotations

import sys

from support.paths import SIM_PKGS

sys.path.insert(0, str(SIM_PKGS))
import enginesim

__all__ = ["enginesim"]
