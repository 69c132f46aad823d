"""A Kubernetes container as the kubelet's log tree names it: namespace, pod, container and current log, read from
files under `--path.rootfs` only (no API server, no CRI socket). The tree's names are the pods' own, so every
function treats them as hostile and returns None instead of raising.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from dataclasses import dataclass

from stallwatch.discovery.workload.rootfs import is_dir, listdir, node_join, rootfs_path, stat_in

__all__ = ["PodContainer", "current_pod_log", "find_pod_container"]

# kubelet truncates `/var/log/containers` names to 255 - len(".log") characters
# (kubernetes/kubernetes pkg/kubelet/kuberuntime/legacy.go, logSymlink).
_LINK_STEM_MAX = 255 - len(".log")
_RESTART_LOG = re.compile(r"([0-9]{1,9})\.log")


@dataclass(frozen=True)
class PodContainer:
    """A Kubernetes container as the kubelet's log tree names it.

    `log_path` is the node path of the current `<restart>.log`; `log_dir` the node path of
    `<podLogsDir>/<namespace>_<pod>_<uid>/<container>` (no trailing slash).
    """

    namespace: str
    pod: str
    pod_uid: str
    container: str
    restart: int
    log_path: str
    log_dir: str


def find_pod_container(
    rootfs: str, pod_logs: str, container_logs: str, container_id: str, pod_uid: str
) -> PodContainer | None:
    """Namespace, pod, container and current log of a Kubernetes container, from the kubelet's log tree only.

    First the legacy link `<container_logs>/<pod>_<ns>_<ctr>-<id>.log` -> `<pod_logs>/<ns>_<pod>_<uid>/<ctr>/<N>.log`
    (kubernetes/kubernetes pkg/kubelet/kuberuntime/legacy.go and helpers.go); when that name was truncated or
    is missing, the pod's directory `<pod_logs>/*_<uid>` (see :func:`_from_pod_dir`). None when neither works.
    """
    pod_uid = pod_uid.replace("_", "-")
    pod_logs = node_join(pod_logs)
    if container_id:
        found = _from_link(rootfs, pod_logs, node_join(container_logs), container_id, pod_uid)
        if found is not None:
            return found
    if pod_uid:
        return _from_pod_dir(rootfs, pod_logs, node_join(container_logs), container_id, pod_uid)
    return None


def current_pod_log(rootfs: str, log_dir: str) -> tuple[str, int] | None:
    """(node path, restart) of the highest `<N>.log` in a container's log dir; None when there is none.

    Rotated files (`N.log.20261129-101500`, `.gz`, `.tmp`: kubernetes/kubernetes
    pkg/kubelet/logs/container_log_manager.go) are ignored; a container restart adds `(N+1).log`.
    """
    log_dir = node_join(log_dir)
    best: tuple[int, str] | None = None
    for name in listdir(rootfs, log_dir):
        match = _RESTART_LOG.fullmatch(name)
        if match is None:
            continue
        restart = int(match.group(1))
        if best is not None and restart <= best[0]:
            continue
        st = stat_in(rootfs, posixpath.join(log_dir, name))
        if st is not None and stat.S_ISREG(st.st_mode):
            best = (restart, name)
    if best is None:
        return None
    return posixpath.join(log_dir, best[1]), best[0]


def _split_pod_dir(name: str) -> tuple[str, str, str] | None:
    """`<ns>_<pod>_<uid>` -> parts; names never hold `_` (kubelet's parsePodUIDFromLogsDirectory splits on it)."""
    parts = name.split("_")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


def _from_link(rootfs: str, pod_logs: str, container_logs: str, container_id: str, pod_uid: str) -> PodContainer | None:
    """Step (a): the `/var/log/containers` link whose name ends in the container ID."""
    suffix = f"-{container_id}.log"
    for name in listdir(rootfs, container_logs):
        if not name.endswith(suffix):
            continue
        target = _link_target(rootfs, posixpath.join(container_logs, name))
        if target is None:
            continue
        found = _parse_log_target(rootfs, pod_logs, target, pod_uid)
        if found is not None:
            return found
    return None


def _link_target(rootfs: str, node_link: str) -> str | None:
    """The normalized node path a link (itself resolved inside rootfs up to its parent) points to."""
    parent = rootfs_path(rootfs, posixpath.dirname(node_link))
    if parent is None:
        return None
    host = os.path.join(parent, posixpath.basename(node_link))
    try:
        if not stat.S_ISLNK(os.lstat(host).st_mode):
            return None
        target = os.readlink(host)
    except (OSError, ValueError):
        return None
    return node_join(target) if target.startswith("/") else node_join(posixpath.dirname(node_link), target)


def _parse_log_target(rootfs: str, pod_logs: str, target: str, pod_uid: str) -> PodContainer | None:
    """A link target `<pod_logs>/<ns>_<pod>_<uid>/<ctr>/<N>.log` as a PodContainer; anything else is refused."""
    log_dir, file_name = posixpath.split(target)
    pod_dir, container = posixpath.split(log_dir)
    root, pod_dir_name = posixpath.split(pod_dir)
    match = _RESTART_LOG.fullmatch(file_name)
    names = _split_pod_dir(pod_dir_name)
    if root != pod_logs or match is None or names is None or not container:
        return None
    namespace, pod, uid = names
    if pod_uid and uid != pod_uid:
        return None
    if not is_dir(rootfs, log_dir):
        return None
    return PodContainer(namespace, pod, uid, container, int(match.group(1)), target, log_dir)


def _from_pod_dir(
    rootfs: str, pod_logs: str, container_logs: str, container_id: str, pod_uid: str
) -> PodContainer | None:
    """Step (b): `<pod_logs>/*_<uid>/<ctr>/`, choosing among several containers as :func:`_pick_container` says."""
    for pod_dir_name in listdir(rootfs, pod_logs):
        names = _split_pod_dir(pod_dir_name)
        if names is None or names[2] != pod_uid:
            continue
        namespace, pod, uid = names
        pod_dir = posixpath.join(pod_logs, pod_dir_name)
        containers = [c for c in listdir(rootfs, pod_dir) if is_dir(rootfs, posixpath.join(pod_dir, c))]
        container = _pick_container(rootfs, container_logs, pod_dir, namespace, pod, containers, container_id)
        if container is None:
            continue
        log_dir = posixpath.join(pod_dir, container)
        current = current_pod_log(rootfs, log_dir)
        if current is None:
            continue
        return PodContainer(namespace, pod, uid, container, current[1], current[0], log_dir)
    return None


def _pick_container(
    rootfs: str, container_logs: str, pod_dir: str, namespace: str, pod: str, containers: list[str], container_id: str
) -> str | None:
    """The container dir for `container_id` among a pod's: the only one; the one a (truncated) link name fits;
    else the newest by mtime (research caveat: only CRI's `status.logPath` is certain, and that needs the socket).
    """
    if len(containers) <= 1:
        return containers[0] if containers else None
    if container_id:
        stems = [n[: -len(".log")] for n in listdir(rootfs, container_logs) if n.startswith(f"{pod}_{namespace}_")]
        fitting = [c for c in containers if any(_link_fits(s, pod, namespace, c, container_id) for s in stems)]
        if len(fitting) == 1:
            return fitting[0]
    newest: tuple[float, str] | None = None
    for container in containers:
        st = stat_in(rootfs, posixpath.join(pod_dir, container))
        if st is not None and (newest is None or st.st_mtime > newest[0]):
            newest = (st.st_mtime, container)
    return newest[1] if newest else None


def _link_fits(stem: str, pod: str, namespace: str, container: str, container_id: str) -> bool:
    """Whether a link name (without `.log`) is the kubelet's name for this container, whole or truncated.

    A truncated name must keep at least one character of the ID: without any, it fits every instance of
    that container and every container whose name it cuts into, so it proves nothing.
    """
    name = f"{pod}_{namespace}_{container}-"
    full = name + container_id
    return stem == full or (len(stem) == _LINK_STEM_MAX and len(stem) > len(name) and full.startswith(stem))
