"""A log of a server: where it is, how it is framed, and how far the exporter, root, may trust the way it opens it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from stallwatch.stable_names import distinct

__all__ = ["LogSource", "named"]


@dataclass(frozen=True)
class LogSource:
    """One log of a server. `name` is its label, what it is to the server (`stdout`, `stderr`, `container`,
    `journal`, `file`), the same across restarts; `path` where it is, in its info series: the node's path of the
    file, the path the process sees, or `journal:<unit>`. `open_path` is where the exporter reads it (under
    `--path.rootfs`, or a `/proc` link). `via` says how far the exporter, root, may trust `open_path`: `path` from
    the admin's config (read when it and its directory belong to root or the server's user: `logs.configured`), `fd`
    a process's `/proc/PID/fd/N` (read only while the process holds it open for writing), `node` a file found
    through a process (never through a symlink: one swapped in after discovery could name any file)."""

    path: str
    open_path: str = ""
    format: str = "plain"  # plain | cri | docker | journal
    journal_match: str = ""  # with format journal: `FIELD=value`
    unavailable: str = ""  # why it cannot be read, when it cannot
    via: str = "path"  # path | fd | node
    # With `path`: the uids a configured file (and its directory) may belong to (`logs.configured`); () reads it as
    # it is (a source made by hand: a test's, a one-off).
    owners: tuple[int, ...] = ()
    name: str = "file"  # made distinct among a server's logs by `named`


def named(sources: Iterable[LogSource]) -> list[LogSource]:
    """A server's logs with distinct names: the second of a kind is `<kind>_2`, and so on."""
    listed = list(sources)
    return [dataclasses.replace(s, name=name) for s, name in zip(listed, distinct(s.name for s in listed), strict=True)]
