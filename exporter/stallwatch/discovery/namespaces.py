"""Who made a process's namespaces: a container runtime (root), or the process's own unprivileged user.

Any user can make a network or mount namespace of its own inside a user namespace of its own (`unshare -rn`), and
put any address on its loopback or any cgroup under its delegated subtree. What such a namespace holds says nothing
about the node: an address in it belongs to someone else in ours, and a process in the node's own mount namespace
is no container, whatever its cgroup is named. The owner of a namespace is the uid that created the user
namespace owning it (ioctl_ns(2): `NS_GET_USERNS`, `NS_GET_OWNER_UID`); the initial user namespace's is 0.
"""

from __future__ import annotations

import fcntl
import os
import struct

from stallwatch.procfs import open_namespace, pid_path

_NSIO = 0xB7
NS_GET_USERNS = (_NSIO << 8) | 0x1  # _IO(NSIO, 0x1): a file descriptor of the owning user namespace
NS_GET_OWNER_UID = (_NSIO << 8) | 0x4  # _IO(NSIO, 0x4): the uid that created a user namespace


def inode(procfs: str, pid: int | str, kind: str) -> int | None:
    """Inode of `pid`'s namespace of `kind` (`net`, `mnt`, ...); None when missing or denied."""
    try:
        return os.stat(pid_path(procfs, pid, "ns", kind)).st_ino
    except (OSError, ValueError):
        return None


def owner_uid(procfs: str, pid: int, kind: str) -> int | None:
    """The uid that created the user namespace owning `pid`'s namespace of `kind`; None when unknown (gone,
    denied, or a kernel without these ioctls)."""
    try:
        fd = open_namespace(procfs, pid, kind)
    except (OSError, ValueError):
        return None
    try:
        userns = fcntl.ioctl(fd, NS_GET_USERNS)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        uid = bytearray(4)
        fcntl.ioctl(userns, NS_GET_OWNER_UID, uid)
        return int(struct.unpack("=I", uid)[0])
    except OSError:
        return None
    finally:
        os.close(userns)


def made_by_root(procfs: str, pid: int, kind: str) -> bool:
    """Whether `pid`'s namespace of `kind` was made by root (a runtime, systemd, the node itself), not by an
    unprivileged user in a user namespace of its own. Unknown counts as not."""
    return owner_uid(procfs, pid, kind) == 0


def in_container(procfs: str, pid: int) -> bool:
    """Whether `pid` runs where a container runtime put it: a mount namespace of its own (runc always makes one),
    not the node's, made by root. The node's is its init's, or where that cannot be read (a sandboxed init) the
    exporter's own."""
    node = inode(procfs, 1, "mnt") or inode(procfs, "self", "mnt")
    own = inode(procfs, pid, "mnt")
    return own is not None and own != node and made_by_root(procfs, pid, "mnt")
