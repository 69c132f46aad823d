"""Where a server's own output can be read, best first: the process's stdout/stderr when it is a regular file
(opened through `/proc/PID/fd/N`, which reaches into the container's mount namespace); the container's CRI log under
the kubelet's pod-log tree; Docker's json-file log (or the journal for its journald driver); the unit's journal
entries. Anything else has no log, or one reported unavailable with the reason.
"""

from __future__ import annotations

import os
import stat

from stallwatch.config import Paths
from stallwatch.discovery.workload import Workload
from stallwatch.discovery.workload.cgroup import short_id
from stallwatch.discovery.workload.docker import DockerContainer
from stallwatch.discovery.workload.rootfs import rootfs_path
from stallwatch.logs.source import LogSource
from stallwatch.procfs import pid_path
from stallwatch.text import printable

__all__ = ["log_sources"]


def log_sources(paths: Paths, pid: int, workload: Workload) -> tuple[LogSource, ...]:
    """Where the server's own output can be read, best first (see the module's docstring); () for none."""
    files = _stdio_files(paths.procfs, pid)
    if files:
        return files
    if workload.pod_log:
        return (_node_file(paths, workload.pod_log, "cri", "container"),)
    if workload.docker is not None:
        return (_docker_log(paths, workload.docker),)
    if workload.unit and _stdout_is_socket(paths.procfs, pid):
        unit = workload.unit
        return (LogSource(f"journal:{unit}", format="journal", journal_match=f"_SYSTEMD_UNIT={unit}",
                          name="journal"),)
    return ()


def _node_file(paths: Paths, node_path: str, fmt: str, name: str) -> LogSource:
    resolved = rootfs_path(paths.rootfs, node_path)
    if resolved is None:
        return LogSource(node_path, format=fmt, name=name,
                         unavailable="not found under --path.rootfs (links are resolved inside it)")
    return LogSource(node_path, resolved, fmt, via="node", name=name)


def _docker_log(paths: Paths, docker: DockerContainer) -> LogSource:
    # moby/moby daemon/logger: json-file is readable; the journald driver tags entries with CONTAINER_ID_FULL;
    # `local` and the rest are the daemon's own formats (daemon/logger/local/doc.go).
    if docker.log_driver == "json-file":
        return _node_file(paths, docker.log_path, "docker", "container")
    if docker.log_driver == "journald":
        return LogSource(f"journal:{docker.name or short_id(docker.id)}", format="journal",
                         journal_match=f"CONTAINER_ID_FULL={docker.id}", name="journal")
    return LogSource(f"docker:{docker.name or short_id(docker.id)}", name="container",
                     unavailable=f"Docker log driver {docker.log_driver!r} is not readable outside dockerd; "
                                 "use json-file or journald")


def _stdio_files(procfs: str, pid: int) -> tuple[LogSource, ...]:
    """stdout and stderr when they are regular files, read through their `/proc/PID/fd` links: the link reaches
    the file in the process's own mount namespace, and follows logrotate's re-opens."""
    out: list[LogSource] = []
    seen: set[tuple[int, int]] = set()
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            link = pid_path(procfs, pid, "fd", str(fd))
            target = os.readlink(link)
            st = os.stat(link)
        except (OSError, ValueError):
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(LogSource(printable(target.removesuffix(" (deleted)")), link, via="fd", name=name))
    return tuple(out)


def _stdout_is_socket(procfs: str, pid: int) -> bool:
    """systemd connects a unit's stdout to journald over a socket (systemd.exec(5), StandardOutput=journal)."""
    try:
        return os.readlink(pid_path(procfs, pid, "fd", "1")).startswith("socket:")
    except (OSError, ValueError):
        return True  # unreadable without ptrace rights: the unit's journal is still the best guess
