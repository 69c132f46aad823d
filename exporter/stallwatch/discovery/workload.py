"""What runs a watched server and where its log is: a Kubernetes container, a Docker container, a systemd
unit or a bare host process, and the log source that fits it (research and sources: `placement.py`).

Log sources, in order: the process's stdout/stderr when it is a regular file (opened through
`/proc/PID/fd/N`, which reaches into the container's mount namespace); the container's CRI log under the
kubelet's pod-log tree; Docker's json-file log (or the journal for its journald driver); the unit's journal
entries. Anything else has no log, or one reported unavailable with the reason.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass

from stallwatch.config import Paths
from stallwatch.discovery import namespaces
from stallwatch.discovery.placement import (
    DockerContainer,
    Placement,
    find_pod_container,
    read_docker,
    read_placement,
    rootfs_path,
    short_id,
)
from stallwatch.text import printable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogSource:
    """One log of a server. `path` is its label: the node's path of the file, the path the process sees, or
    `journal:<unit>`. `open_path` is where the exporter reads it (under `--path.rootfs`, or a `/proc` link).
    `via` says how far the exporter, root, may trust `open_path`: `path` from the admin's config (symlinks
    followed), `fd` a process's `/proc/PID/fd/N` (read only while the process holds it open for writing), `node`
    a file found through a process (never through a symlink: one swapped in after discovery could name any
    file)."""

    path: str
    open_path: str = ""
    format: str = "plain"  # plain | cri | docker | journal
    journal_match: str = ""  # with format journal: `FIELD=value`
    unavailable: str = ""  # why it cannot be read, when it cannot
    via: str = "path"  # path | fd | node


@dataclass(frozen=True)
class Workload:
    """What runs the server (`runtime` = kubernetes | docker | systemd | host) and what it calls it."""

    runtime: str = "host"
    namespace: str = ""
    pod: str = ""
    container: str = ""
    container_id: str = ""
    unit: str = ""
    pod_log: str = ""  # node path of the container's current CRI log
    docker: DockerContainer | None = None

    @property
    def name(self) -> str | None:
        """The server name this workload suggests, unique on the node; None for a bare host process."""
        if self.pod:
            return f"{self.namespace}/{self.pod}"
        if self.docker is not None:
            return self.docker.name or short_id(self.container_id)
        if self.unit:
            return self.unit
        return None


def locate(paths: Paths, pid: int) -> Workload:
    """The workload of process `pid`, from its cgroup and the runtimes' files; a host one when unknown.

    A cgroup named like a container's is believed only for a process a runtime put in a container (its own mount
    namespace, made by root): any user can make cgroups under its delegated `user@UID.service` subtree and name
    them after another pod's, whose root-only log and identity would then be taken for its process."""
    placement = read_placement(paths.procfs, pid) or Placement("host")
    if placement.runtime in ("kubernetes", "docker") and not namespaces.in_container(paths.procfs, pid):
        log.warning("pid %d is in cgroup of %s container %s but not in a container's mount namespace: "
                    "read as a host process", pid, placement.runtime, short_id(placement.container_id))
        placement = Placement("host")
    if placement.runtime == "kubernetes":
        pod = find_pod_container(paths.rootfs, paths.pod_logs, paths.container_logs, placement.container_id,
                                 placement.pod_uid)
        if pod is None:
            return Workload("kubernetes", container_id=placement.container_id)
        return Workload("kubernetes", pod.namespace, pod.pod, pod.container, placement.container_id,
                        pod_log=pod.log_path)
    if placement.runtime == "docker":
        docker = read_docker(paths.rootfs, paths.docker, placement.container_id)
        return Workload("docker", container=docker.name if docker else "", container_id=placement.container_id,
                        docker=docker)
    return Workload(placement.runtime, unit=placement.unit)


def log_sources(paths: Paths, pid: int, workload: Workload) -> tuple[LogSource, ...]:
    """Where the server's own output can be read, best first (see the module's docstring)."""
    files = _stdio_files(paths.procfs, pid)
    if files:
        return files
    if workload.pod_log:
        return (_node_file(paths, workload.pod_log, "cri"),)
    if workload.docker is not None:
        return (_docker_log(paths, workload.docker),)
    if workload.unit and _stdout_is_socket(paths.procfs, pid):
        unit = workload.unit
        return (LogSource(f"journal:{unit}", format="journal", journal_match=f"_SYSTEMD_UNIT={unit}"),)
    return ()


def _node_file(paths: Paths, node_path: str, fmt: str) -> LogSource:
    resolved = rootfs_path(paths.rootfs, node_path)
    if resolved is None:
        return LogSource(node_path, format=fmt,
                         unavailable="not found under --path.rootfs (links are resolved inside it)")
    return LogSource(node_path, resolved, fmt, via="node")


def _docker_log(paths: Paths, docker: DockerContainer) -> LogSource:
    # moby/moby daemon/logger: json-file is readable; the journald driver tags entries with CONTAINER_ID_FULL;
    # `local` and the rest are the daemon's own formats (daemon/logger/local/doc.go).
    if docker.log_driver == "json-file":
        return _node_file(paths, docker.log_path, "docker")
    if docker.log_driver == "journald":
        return LogSource(f"journal:{docker.name or short_id(docker.id)}", format="journal",
                         journal_match=f"CONTAINER_ID_FULL={docker.id}")
    return LogSource(f"docker:{docker.name or short_id(docker.id)}",
                     unavailable=f"Docker log driver {docker.log_driver!r} is not readable outside dockerd; "
                                 "use json-file or journald")


def _stdio_files(procfs: str, pid: int) -> tuple[LogSource, ...]:
    """stdout and stderr when they are regular files, read through their `/proc/PID/fd` links: the link reaches
    the file in the process's own mount namespace, and follows logrotate's re-opens."""
    out: list[LogSource] = []
    seen: set[tuple[int, int]] = set()
    for fd in (1, 2):
        link = f"{procfs}/{pid}/fd/{fd}"
        try:
            target = os.readlink(link)
            st = os.stat(link)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(LogSource(printable(target.removesuffix(" (deleted)")), link, via="fd"))
    return tuple(out)


def _stdout_is_socket(procfs: str, pid: int) -> bool:
    """systemd connects a unit's stdout to journald over a socket (systemd.exec(5), StandardOutput=journal)."""
    try:
        return os.readlink(f"{procfs}/{pid}/fd/1").startswith("socket:")
    except OSError:
        return True  # unreadable without ptrace rights: the unit's journal is still the best guess
