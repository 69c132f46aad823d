"""What runs a watched server, read from files only: a Kubernetes container, a Docker container, a systemd unit or
a bare host process (`locate`), and where its log is (`log_sources`).

Nothing here talks to an API server or a runtime socket: the cgroup path of a process names its container and pod
(`cgroup`), the kubelet's log tree names its namespace, pod and container (`kubelet`), and Docker's per-container
JSON names its log driver and addresses (`docker`), all read under `--path.rootfs` without leaving it (`rootfs`).
All of it is written by (or on behalf of) other users, so every function treats its input as hostile and returns a
neutral value instead of raising.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from stallwatch.config import Paths
from stallwatch.discovery import namespaces
from stallwatch.discovery.workload.cgroup import Placement, read_placement, short_id
from stallwatch.discovery.workload.docker import DockerContainer, read_docker
from stallwatch.discovery.workload.kubelet import find_pod_container

__all__ = ["Workload", "locate"]

log = logging.getLogger(__name__)


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
