"""Text read from other processes (command lines, titles, paths, pod names, log lines) made safe to show.

Bytes that are not UTF-8 reach Python surrogate-escaped; they would fail the exposition's or a page's encoding.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """Text read from another process (surrogate-escaped bytes that are not UTF-8) made safe to export."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def display(text: str) -> str:
    """`printable`, and lone surrogates it cannot carry (e.g. a YAML `"\\ud800"`) as `\\ud800` text."""
    try:
        return printable(text)
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
