"""Configured log paths and globs are read as a process's files are: not in a directory others can write (but with
the sticky bit), not another user's files, not another user's symlinks (audit 2026-12-02 #7: a neighbour's symlink in a
team's 777 directory put a root-only file on the status page)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from stallwatch.logs import configured
from stallwatch.logs.configured import expand, open_configured, owners_for
from stallwatch.logs.source import LogSource
from stallwatch.signals.logs import LogManager
from support.watchers import log_watcher

NEIGHBOUR = 1001
LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's files: chown needs root")


def _team(tmp_path: Path, mode: int) -> Path:
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(mode)
    (team / "server.log").write_bytes(LAUNCH)
    return team


def test_a_glob_in_a_directory_everyone_can_write_is_refused_and_says_why(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    team = _team(tmp_path, 0o777)
    pattern = str(team / "*.log")
    (source,) = expand([LogSource(pattern, pattern)], owners_for(None))
    assert source.path == pattern and "is writable by everyone (mode 777, no sticky bit)" in source.unavailable
    watcher = log_watcher({"team-cfg": [pattern]})
    manager = LogManager(watcher, poll_interval=1.0)
    with caplog.at_level(logging.WARNING):
        manager.poll()
    assert [(s.path, s.up) for s in manager.stats()] == [(pattern, False)]
    assert watcher.servers()[0].interpreter.snapshot().phase == "stopped"
    assert "writable by everyone" in caplog.text


def test_a_source_that_says_why_it_cannot_be_read_keeps_its_reason() -> None:
    """Docker's `local` driver: no file to check, and the reason must reach log_up's warning (it was lost, and the
    follower stat'ed the label)."""
    unreadable = LogSource("docker:vllm-1", unavailable="Docker log driver 'local' is not readable outside dockerd")
    assert expand([unreadable], owners_for(None)) == [unreadable]


def test_a_configured_path_in_a_directory_everyone_can_write_is_down(tmp_path: Path) -> None:
    team = _team(tmp_path, 0o777)
    path = str(team / "server.log")
    with pytest.raises(PermissionError, match="writable by everyone"):
        open_configured(LogSource(path, path, owners=owners_for(None)))


def test_in_a_directory_a_group_can_write_a_file_with_one_link_is_read_and_a_hard_link_is_not(tmp_path: Path) -> None:
    """`/var/log` is group `syslog`'s to write: its files are read, but not a hard link made there (of any file,
    where `fs.protected_hardlinks` is 0)."""
    team = _team(tmp_path, 0o775)
    path = team / "server.log"
    os.close(open_configured(LogSource(str(path), str(path), owners=owners_for(None))))
    secret = tmp_path / "secret"
    secret.write_bytes(b"DB_PASSWORD=hunter2-SECRET\n")
    linked = team / "linked.log"
    os.link(secret, linked)
    with pytest.raises(PermissionError, match="it has 2 links, in a directory others can write"):
        open_configured(LogSource(str(linked), str(linked), owners=owners_for(None)))
    assert [s.path for s in expand([LogSource(str(team / "*.log"), str(team / "*.log"))], owners_for(None))] == [
        str(path)]


def test_a_file_of_none_of_the_owners_is_refused(tmp_path: Path) -> None:
    """Whose files are not to be read is whoever is not root, the exporter's user or the server's: here the test's
    own files stand for another user's (`owners` without their uid)."""
    team = _team(tmp_path, 0o755)
    path = str(team / "server.log")
    others = (os.geteuid() + 12345,)
    assert "belongs to uid" in expand([LogSource(str(team / "*.log"), str(team / "*.log"))], others)[0].unavailable
    with pytest.raises(PermissionError, match=f"belongs to uid {os.geteuid()}"):
        open_configured(LogSource(path, path, owners=others))


def test_a_file_swapped_for_a_symlink_after_its_check_is_not_followed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    team = _team(tmp_path, 0o755)
    path, secret = team / "server.log", tmp_path / "secret"
    secret.write_bytes(b"DB_PASSWORD=hunter2-SECRET\n")
    checked = os.lstat(path)  # what the check saw: a regular file
    path.unlink()
    path.symlink_to(secret)  # ... and what is there when the file is opened
    monkeypatch.setattr(configured, "_check_entry", lambda p, owners, guarded: checked)
    with pytest.raises(OSError) as raised:
        open_configured(LogSource(str(path), str(path), owners=owners_for(None)))
    assert raised.value.errno == errno.ELOOP


@as_root
def test_a_sticky_directory_skips_a_neighbours_files_and_symlinks(tmp_path: Path) -> None:
    """The audit's reproduction, in a team directory with the sticky bit (777 without it is refused above): the
    neighbour's own file of launch banners and its symlink to a root-only secret are not followed, the server's file
    is."""
    team = _team(tmp_path, 0o1777)
    secret = tmp_path / "secret"
    secret.write_bytes(b"DB_PASSWORD=hunter2-SECRET\n")
    secret.chmod(0o600)
    banners = team / "zz.log"
    banners.write_bytes(LAUNCH * 2)
    os.chown(banners, NEIGHBOUR, NEIGHBOUR)
    link = team / "z2.log"
    link.symlink_to(secret)
    os.lchown(link, NEIGHBOUR, NEIGHBOUR)
    watcher = log_watcher({"team-cfg": [str(team / "*.log")]})
    manager = LogManager(watcher, poll_interval=1.0)
    manager.poll()
    assert [(s.path, s.up) for s in manager.stats()] == [(str(team / "server.log"), True)]
    assert watcher.servers()[0].interpreter.snapshot().events["server_restart"] == 0


@as_root
def test_a_configured_symlink_of_another_user_is_down_and_one_to_another_users_file_too(tmp_path: Path) -> None:
    team = _team(tmp_path, 0o755)
    secret = tmp_path / "secret"
    secret.write_bytes(b"DB_PASSWORD=hunter2-SECRET\n")
    link = team / "link.log"
    link.symlink_to(secret)
    os.lchown(link, NEIGHBOUR, NEIGHBOUR)
    with pytest.raises(PermissionError, match=f"a symlink of uid {NEIGHBOUR}"):
        open_configured(LogSource(str(link), str(link), owners=owners_for(None)))
    theirs = team / "theirs.log"
    theirs.write_bytes(LAUNCH)
    os.chown(theirs, NEIGHBOUR, NEIGHBOUR)
    admins = team / "admins.log"
    admins.symlink_to(theirs)  # root's symlink, to a file of the neighbour's: not the server's either
    with pytest.raises(PermissionError, match=f"belongs to uid {NEIGHBOUR}"):
        open_configured(LogSource(str(admins), str(admins), owners=owners_for(None)))
    os.close(open_configured(LogSource(str(admins), str(admins), owners=owners_for(NEIGHBOUR))))  # theirs: read
