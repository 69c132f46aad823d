"""Text read from other processes (command lines, titles, paths, pod names, log lines) made safe to show.

Bytes that are not UTF-8 reach Python surrogate-escaped; they would fail the exposition's or a page's encoding.
"""

from __future__ import annotations

import re

# C0 and C1 controls but newline and tab: escape sequences (CSI, OSC 0 window titles, OSC 52 clipboard writes) and
# carriage returns that would redraw an operator's terminal from another user's argv, paths, titles or log lines;
# and the bidirectional controls (Bidi_Control, Unicode UAX #9: U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069),
# with which a process's name reverses the rest of a line on a page or a terminal ("Trojan Source", CVE-2021-42574).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_ODD_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")  # what surrogateescape cannot turn back into a byte


def printable(text: str) -> str:
    """Text read from another process (surrogate-escaped bytes that are not UTF-8) made safe to export."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def display(text: str) -> str:
    """`printable`, and lone surrogates it cannot carry (e.g. a YAML `"\\ud800"`) as `\\ud800` text."""
    try:
        return printable(text)
    except UnicodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def utf8_bytes(text: str) -> bytes:
    """UTF-8 of text decoded from another process's JSON, never raising: `\\udc80`-`\\udcff` (and undecodable
    input) become the raw byte again; other lone surrogates, which only a hand-made `\\udXXX` escape holds, become
    U+FFFD."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return _ODD_SURROGATE.sub("\ufffd", text).encode("utf-8", "surrogateescape")


def terminal_safe(text: str) -> str:
    """Text for a terminal or a page: every control character but newline and tab written as `\\xNN`, every
    bidirectional control as `\\uNNNN`."""
    return _CONTROLS.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
