"""The converters that check one YAML value for a config field (`reader.setting`): each returns the value it
accepts or raises ValueError with what was expected."""

from __future__ import annotations

import pwd
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from stallwatch.config.units import parse_duration

MAX_REGEX_CHARS = 4096


def string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    try:
        value.encode("utf-8")  # a `"\ud800"` escape gives a lone surrogate, which no label or path can carry
    except UnicodeEncodeError:
        raise ValueError(f"expected valid Unicode text, got {value!r}") from None
    return value


PD_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")


def pd_group(value: Any) -> str:
    """A PD group's name: the same on every node's config for one group, quoted into PromQL selectors of alert
    templates, so letters, digits and `._:/-` only."""
    text = string(value)
    if not PD_GROUP.fullmatch(text):
        raise ValueError(f"expected a group name of letters, digits and ._:/- (at most 200), got {text!r}")
    return text


def log_path(value: Any) -> str:
    text = string(value)
    if "\0" in text:  # the OS refuses it at every open, which would stop every server's logs
        raise ValueError(f"expected a path without NUL bytes, got {text!r}")
    return text


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration above zero, got {value!r}")
    return seconds


def duration_at_least(floor: float) -> Callable[[Any], float]:
    """A duration of at least `floor` seconds: an interval that sizes a ring or paces a loop (a `10ms` history
    interval would keep 360,000 points per server, a `1ns` probe interval spin a thread)."""
    def check(value: Any) -> float:
        seconds = positive_duration(value)
        if seconds < floor:
            raise ValueError(f"expected a duration of at least {floor:g}s, got {value!r}")
        return seconds
    return check


LOOP_FLOOR = 0.1  # seconds: the shortest interval of a loop (discovery, probes, fetches, log polls, NVML reads)
LOOP_INTERVAL = duration_at_least(LOOP_FLOOR)


def url(value: Any) -> str:
    text = string(value)
    if not re.match(r"https?://[^/\s]+", text):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    port = urlsplit(text).port  # raises ValueError for a port that is not 0-65535: refused here, not in a probe
    if port == 0 or not text.isascii():
        raise ValueError(f"expected an ASCII URL with a port from 1 to 65535, got {text!r}")
    return text


def absolute_path(value: Any) -> str:
    text = string(value)
    if not text.startswith("/") or "\0" in text:
        raise ValueError(f"expected an absolute path, got {text!r}")
    return text


def _compiled(text: str, pattern: str | bytes) -> re.Pattern[Any]:
    if len(text) > MAX_REGEX_CHARS:
        raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
    try:
        return re.compile(pattern, re.MULTILINE if isinstance(pattern, bytes) else 0)
    # OverflowError: a repeat count too big; RecursionError: thousands of nested groups.
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"invalid regular expression {text[:80]!r}: {exc}") from None


def command_regex(value: Any) -> re.Pattern[str]:
    """A pattern on command lines (text)."""
    text = string(value)
    return _compiled(text, text)


def log_regex(value: Any) -> re.Pattern[bytes]:
    """A pattern on log lines, which are bytes: compiled as the engines' rules are, so `(?u)` or `\\N{...}`,
    valid as text only, are refused here rather than failing later."""
    text = string(value)
    return _compiled(text, text.encode())


def choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return value

    return convert


def count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise ValueError(f"expected a whole number from 1 to 100000, got {value!r}")
    return value


def gpu_index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a GPU index (0, 1, ...), got {value!r}")
    return value


MAX_UID = 2**32 - 2  # (uid_t)-1 is "no uid"


def user_id(value: Any) -> int:
    """A uid (`0`, `1000`) or a user name of the exporter's own user database (in a container, its image's: give
    the number there)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_UID:
        return value
    if isinstance(value, str) and value and value.isprintable():
        try:
            return pwd.getpwnam(value).pw_uid
        except (KeyError, ValueError):  # unknown, or a NUL
            pass
    raise ValueError(f"expected a uid (0 to {MAX_UID}) or a user name known on this system, got {value!r}")
