"""Parsing of the human units that config files use: durations and byte sizes."""

from __future__ import annotations

import math
import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]i?B|B)?\s*")
# Beyond these a value is a typo or an attack, and would overflow what takes it (`Event.wait`, float maths).
MAX_DURATION_SECONDS = 366 * 86400.0
MAX_SIZE_BYTES = float(2**60)

_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50,
}


def parse_duration(value: object) -> float:
    """Seconds from `30s`, `10m`, `1h30m`, `500ms` or a bare number of seconds: finite, 0 to 366 days."""
    seconds = _duration(value)
    if not 0 <= seconds <= MAX_DURATION_SECONDS:  # also refuses NaN, which compares false
        raise ValueError(f"expected a duration from 0 to 366d, got {value!r}")
    return seconds


def _duration(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 30s, 10m, 1h, got {value!r}")
    if isinstance(value, (int, float)):
        return _float(value)
    text = str(value).strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += _float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(text):
        raise ValueError(f"expected a duration like 30s, 10m, 1h, got {value!r}")
    return total


def _float(value: float | str) -> float:
    """`float()` that gives ValueError for a number too big for a float (`0xfff...` is an int in YAML)."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"number out of range: {str(value)[:40]}") from None


def parse_size(value: object) -> float:
    """Bytes from `70e9`, `70GB`, `65GiB`, `512MiB` or a bare number of bytes: finite, 0 to 1 EiB."""
    size = _size(value)
    if not (math.isfinite(size) and 0 <= size <= MAX_SIZE_BYTES):
        raise ValueError(f"expected a size from 0 to 1EiB, got {str(value)[:40]!r}")
    return size


def _size(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 70e9, 70GB, 65GiB, got {value!r}")
    if isinstance(value, (int, float)):
        number, unit = _float(value), "B"
    else:
        match = _SIZE.fullmatch(str(value))
        if not match:
            raise ValueError(f"expected a size like 70e9, 70GB, 65GiB, got {value!r}")
        number, unit = _float(match.group(1)), match.group(2) or "B"
    return number * _SIZE_UNITS[unit]
