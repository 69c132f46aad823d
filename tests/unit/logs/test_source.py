"""A server's logs named for what they are, distinct among its own."""

from __future__ import annotations

from stallwatch.logs.source import LogSource, named


def test_a_servers_logs_get_distinct_names_and_keep_their_paths() -> None:
    sources = [LogSource("/var/log/a.log"), LogSource("/var/log/b.log"), LogSource("/proc/1/fd/2", name="stderr")]
    assert [(s.name, s.path) for s in named(sources)] == [
        ("file", "/var/log/a.log"), ("file_2", "/var/log/b.log"), ("stderr", "/proc/1/fd/2")]
