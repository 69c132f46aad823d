"""Node paths under a *rootfs* (node_exporter's `--path.rootfs`), never leaving it.

A node path such as `/var/log/pods` is looked up as `<rootfs>/var/log/pods`, and every symlink met on the way is
re-rooted under `<rootfs>` by :func:`rootfs_path` instead of being followed by the kernel, so that an absolute link
on the node never leads out of the mounted tree into the exporter's own container. The trees read here (the
kubelet's logs, Docker's state) are written by or for other users: every function returns a neutral value instead of
raising.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import stat

from stallwatch.procfs import read_bounded

__all__ = ["JSON_READ_LIMIT", "MISSING", "is_dir", "listdir", "node_join", "read_json", "rootfs_path", "stat_in"]

JSON_READ_LIMIT = 4 * 1024 * 1024
_MAX_SYMLINKS = 40  # the kernel's own limit on links followed in one lookup (MAXSYMLINKS)
MISSING = object()  # what `read_json` returns for a file that does not exist (as opposed to one that cannot be parsed)


def rootfs_path(rootfs: str, node_path: str) -> str | None:
    """The path under `rootfs` that `node_path` names on the node, with symlinks resolved inside rootfs.

    Absolute link targets restart at `rootfs`, `..` stops at it, at most 40 links are followed; None when a
    component is missing, unreadable, or a link loops. Like cyphar/filepath-securejoin, which runc uses for
    the same purpose. The result holds no symlink at the time of the call (a later swap is not prevented).
    """
    pending = _path_components_for_walk(node_path)
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop()
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        host = os.path.join(rootfs, *resolved, part)
        try:
            st = os.lstat(host)
        except (OSError, ValueError):
            return None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_SYMLINKS:
                return None
            try:
                target = os.readlink(host)
            except (OSError, ValueError):
                return None
            if target.startswith("/"):
                resolved = []
            pending.extend(_path_components_for_walk(target))
            continue
        if pending and not stat.S_ISDIR(st.st_mode):
            return None
        resolved.append(part)
    return os.path.join(rootfs, *resolved)


def _path_components_for_walk(path: str) -> list[str]:
    """Components of `path` as a stack (last component first), keeping `..` for the walk to apply."""
    return [c for c in reversed(path.split("/")) if c not in ("", ".")]


def node_join(*parts: str) -> str:
    """A normalized absolute node path; `..` cannot climb above `/` (and POSIX's special `//` is folded)."""
    return "/" + posixpath.normpath("/" + "/".join(parts)).lstrip("/")


def listdir(rootfs: str, node_dir: str) -> list[str]:
    """Names in a node directory, sorted; [] when it is missing or unreadable."""
    host = rootfs_path(rootfs, node_dir)
    if host is None:
        return []
    try:
        return sorted(os.listdir(host))
    except (OSError, ValueError):
        return []


def stat_in(rootfs: str, node_path: str) -> os.stat_result | None:
    """stat of a node path after resolving it inside rootfs; None when absent."""
    host = rootfs_path(rootfs, node_path)
    if host is None:
        return None
    try:
        return os.lstat(host)
    except (OSError, ValueError):
        return None


def is_dir(rootfs: str, node_path: str) -> bool:
    """Whether a node path is a directory, resolved inside rootfs."""
    st = stat_in(rootfs, node_path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def read_json(rootfs: str, node_path: str) -> object:
    """Parsed JSON, `MISSING` when the file is absent, or None when it is unreadable, too big or malformed."""
    host = rootfs_path(rootfs, node_path)
    if host is None:
        return MISSING if _is_missing(rootfs, node_path) else None
    try:
        data = read_bounded(host, JSON_READ_LIMIT + 1, nofollow=True)  # nofollow: no late link swap
    except FileNotFoundError:
        return MISSING
    except (OSError, ValueError):
        return None
    if len(data) > JSON_READ_LIMIT:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _is_missing(rootfs: str, node_path: str) -> bool:
    """Whether the file itself is absent while its directory resolves (so not merely unreadable)."""
    parent = rootfs_path(rootfs, posixpath.dirname(node_path))
    if parent is None:
        return False
    try:
        os.lstat(os.path.join(parent, posixpath.basename(node_path)))
    except OSError as e:
        return e.errno == errno.ENOENT
    return False
