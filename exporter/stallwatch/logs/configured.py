"""The admin's configured log paths and globs (`logs:`), read by the exporter as root, checked as a process's files
are (audit 2026-12-02 #7: a glob in a team's directory mode 777 followed a neighbour's symlink to a root-only file,
and showed it on the status page, and took the neighbour's banners as the server's relaunches).

A configured file is read when its directory belongs to root, the exporter's user or the server's and is not
writable by everyone without the sticky bit (the audit's 777: anyone could swap any file), and the file belongs to one
of them: a regular file, or a symlink that root (the admin) or the exporter's user made, whose target belongs to one
of them too. In a directory others can write (`/var/log` is group `syslog`'s, `/tmp` everyone's with the sticky bit)
a file must also have one link: a hard link made there could be of any file (where `fs.protected_hardlinks` is 0).
A glob's matches that fail are not followed (nor shown); a path that fails is `log_up 0`, saying why.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import stat
from collections.abc import Iterable

from stallwatch.logs.source import LogSource
from stallwatch.procfs import open_regular

__all__ = ["expand", "open_configured", "owners_for"]

log = logging.getLogger(__name__)


def owners_for(uid: int | None) -> tuple[int, ...]:
    """Whose files a server's configured logs may be: root's, the exporter's own (it reads nothing it could not
    read anyway) and the server's user's, where known."""
    return tuple(sorted({0, os.geteuid(), *(() if uid is None else (uid,))}))


def expand(sources: Iterable[LogSource], owners: tuple[int, ...]) -> list[LogSource]:
    """The configured sources as files to follow, each with `owners`: a glob becomes one source per match that
    passes the checks, or one that says why its directory is refused."""
    out: list[LogSource] = []
    for source in sources:
        if source.via != "path" or source.format != "plain" or source.unavailable:  # not a file to check: as it is
            out.append(source)
            continue
        if not glob.has_magic(source.open_path):
            out.append(LogSource(source.path, source.open_path, owners=owners))
            continue
        directory = os.path.dirname(os.path.abspath(source.open_path))
        refused = _refused_directory(directory, owners)
        if refused:
            out.append(LogSource(source.path, source.open_path, unavailable=refused))
            continue
        guarded = _others_can_write(directory)
        for path in sorted(glob.glob(source.open_path)):
            try:
                _check_entry(path, owners, guarded)
            except OSError as exc:
                log.debug("configured log %s not followed: %s", path, exc.strerror)
                continue
            out.append(LogSource(path, path, owners=owners))
    return list({s.path: s for s in out}.values())


def open_configured(source: LogSource) -> int:
    """A read-only descriptor of the configured file, checked before and after it is opened: a file swapped for a
    symlink in between is refused (ELOOP), a root-made symlink re-pointed in between too."""
    path, owners = source.open_path, source.owners
    directory = os.path.dirname(os.path.abspath(path))
    refused = _refused_directory(directory, owners)
    if refused:
        raise PermissionError(errno.EACCES, refused)
    guarded = _others_can_write(directory)
    link = _check_entry(path, owners, guarded)
    followed = stat.S_ISLNK(link.st_mode)
    fd = open_regular(path, nofollow=not followed)
    try:
        opened = os.fstat(fd)
        _check_file(opened, owners, guarded and not followed)
        if followed:
            again, now = os.lstat(path), os.stat(path)
            if _ident(again) != _ident(link) or _ident(now) != _ident(opened):
                raise OSError(errno.EAGAIN, "the symlink changed while it was opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


_WHOSE = "not root's, the exporter's or the server's user's"


def _refused_directory(directory: str, owners: tuple[int, ...]) -> str:
    """Why the exporter does not read configured files in `directory`; "" when it does."""
    try:
        st = os.stat(directory)
    except OSError:
        return ""  # not there (yet): nothing in it to read; the file's own open says so
    if st.st_uid not in owners:
        return f"its directory {directory} belongs to uid {st.st_uid}, {_WHOSE}"
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return (f"its directory {directory} is writable by everyone (mode {stat.S_IMODE(st.st_mode):o}, no sticky "
                "bit): anyone can swap the file")
    return ""


def _others_can_write(directory: str) -> bool:
    try:
        return bool(os.stat(directory).st_mode & (stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        return False


def _check_entry(path: str, owners: tuple[int, ...], guarded: bool) -> os.stat_result:
    """The path's own entry (lstat), when it is one the exporter reads: a file of one of `owners` (with one link
    where `guarded`: others can write its directory), or a symlink of root's (or the exporter's user's);
    PermissionError saying why otherwise (a missing one raises as lstat does)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (0, os.geteuid()):
            raise PermissionError(errno.EACCES, f"a symlink of uid {st.st_uid}: only root's (the admin's) are followed")
    else:
        _check_file(st, owners, guarded)
    return st


def _check_file(st: os.stat_result, owners: tuple[int, ...], guarded: bool) -> None:
    if st.st_uid not in owners:
        raise PermissionError(errno.EACCES, f"it belongs to uid {st.st_uid}, {_WHOSE}")
    if guarded and st.st_nlink > 1:
        raise PermissionError(errno.EACCES, f"it has {st.st_nlink} links, in a directory others can write")


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino
