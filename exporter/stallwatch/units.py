"""Parsing of the human units that config files use: durations and byte sizes."""

from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]i?B|B)?\s*")
_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50,
}


def parse_duration(value: object) -> float:
    """Seconds from `30s`, `10m`, `1h30m`, `500ms` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 10m, 1h, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"expected a non-negative duration, got {value!r}")
        return float(value)
    text = str(value).strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise ValueError(f"expected a duration like 30s, 10m, 1h, got {value!r}")
    return total


def parse_size(value: object) -> float:
    """Bytes from `70e9`, `70GB`, `65GiB`, `512MiB` or a bare number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 70e9, 70GB, 65GiB, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = float(value), "B"
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise ValueError(f"expected a size like 70e9, 70GB, 65GiB, got {value!r}")
        number, unit = float(match.group(1)), match.group(2) or "B"
    if number < 0:
        raise ValueError(f"expected a non-negative size, got {value!r}")
    return number * _SIZE_UNITS[unit]
