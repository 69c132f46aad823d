"""Durations and sizes as the config file writes them."""

from __future__ import annotations

import pytest

from stallwatch.config.units import parse_duration, parse_size


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("10m", 600), ("1h", 3600), ("1h30m", 5400),
                                                ("500ms", 0.5), (15, 15)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "size"), [("70e9", 70e9), ("70GB", 70e9), ("65GiB", 65 * 2**30),
                                            ("512MiB", 512 * 2**20), (1000, 1000), ("1.5 TB", 1.5e12)])
def test_sizes(text: object, size: float) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "1x", "m10", "10m5", "10 s", "-5s", True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)
