"""Stable names: a kind once is its name, the second of a kind is numbered."""

from __future__ import annotations

from stallwatch.stable_names import distinct


def test_the_second_of_a_kind_is_numbered_in_order() -> None:
    assert distinct(["stdout", "stderr"]) == ["stdout", "stderr"]
    assert distinct(["file", "file", "container", "file"]) == ["file", "file_2", "container", "file_3"]
    assert distinct([]) == []
