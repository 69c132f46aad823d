"""The Prometheus text format as the engines' pages write it (prometheus/docs `exposition_formats.md`):
`name{label="value",...} value [timestamp]`, read line by line."""

from __future__ import annotations

import re
from collections.abc import Sequence

PAIR = rb'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"'
PAIRS = re.compile(PAIR)
# The rest of a line after the name.
SAMPLE = re.compile(rb"(?:\{(?P<labels>(?:" + PAIR + rb"[ \t]*,?[ \t]*)*)\})?"
                    rb"[ \t]+(?P<value>\S+)(?:[ \t]+-?\d+)?[ \t\r]*")


def sample_lines(names: Sequence[str]) -> re.Pattern[bytes]:
    """The lines of exactly these sample names (a longer name that begins with one is another family's)."""
    return re.compile(rb"^(" + b"|".join(re.escape(name.encode()) for name in names) + rb")([{ \t].*)$", re.M)
