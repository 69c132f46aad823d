"""Where a watched server process lives (Kubernetes, Docker, a systemd unit, the host), read from files only.

Nothing here talks to an API server or a runtime socket: the cgroup path of a process names its container and
pod, the kubelet's log tree names its namespace, pod and container, and Docker's per-container JSON names its
log driver and addresses. All of it is written by (or on behalf of) other users, so every function here treats
its input as hostile and returns a neutral value instead of raising.

Filesystem reads go through a *rootfs* (node_exporter's `--path.rootfs`): a node path such as
`/var/log/pods` is looked up as `<rootfs>/var/log/pods`, and every symlink met on the way is re-rooted
under `<rootfs>` by :func:`rootfs_path` instead of being followed by the kernel, so that an absolute link on
the node never leads out of the mounted tree into the exporter's own container.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import posixpath
import re
import stat
from dataclasses import dataclass

__all__ = [
    "DockerContainer",
    "Placement",
    "PodContainer",
    "current_pod_log",
    "find_pod_container",
    "parse_cgroup",
    "read_docker",
    "read_placement",
    "rootfs_path",
    "short_id",
]

CGROUP_READ_LIMIT = 64 * 1024
JSON_READ_LIMIT = 4 * 1024 * 1024
# kubelet truncates `/var/log/containers` names to 255 - len(".log") characters
# (kubernetes/kubernetes pkg/kubelet/kuberuntime/legacy.go, logSymlink).
_LINK_STEM_MAX = 255 - len(".log")
_MAX_SYMLINKS = 40  # the kernel's own limit on links followed in one lookup (MAXSYMLINKS)

_HEX64 = re.compile(r"[0-9a-f]{64}")
# Pixie's pattern (pixie-io/pixie src/shared/metadata/cgroup_path_resolver.cc) plus the 32-hex UID of static pods;
# anchored so that `pod` inside another word, or a longer hex run, does not match.
_POD_UID = re.compile(
    r"(?:^|[/_.-])pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
    r"(?![0-9a-f])"
)
# Characters systemd allows in unit names (systemd.unit(5)), so a unit can go into a journal match safely.
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]{1,247}\.service")
_RESTART_LOG = re.compile(r"([0-9]{1,9})\.log")
# Prefixes runc is given by each runtime's systemd cgroup driver (`<prefix>-<id>.scope`) or cgroupfs CRI-O.
_ID_PREFIXES = ("cri-containerd-", "docker-", "crio-")
_CRI_PREFIXES = ("cri-containerd-", "crio-")
# v1 hierarchies most likely to carry the container's path on a v1 or hybrid host, best first.
_V1_PREFERENCE = ("name=systemd", "pids", "memory", "cpu")


@dataclass(frozen=True)
class Placement:
    """What runs a process: `runtime` is "kubernetes" | "docker" | "systemd" | "host".

    `container_id` is 64 lowercase hex or ""; `pod_uid` is the UID with dashes (32 hex for static pods) or "";
    `unit` is a system unit such as "sglang.service" or "".
    """

    runtime: str
    container_id: str = ""
    pod_uid: str = ""
    unit: str = ""


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


@dataclass(frozen=True)
class DockerContainer:
    """A Docker container as its `config.v2.json` and `hostconfig.json` describe it.

    `log_driver` is "unknown" when hostconfig.json exists but cannot be read or parsed; `log_path` is the node
    path json-file would write, whatever the driver (check `log_driver` before tailing it).
    """

    id: str
    name: str
    log_driver: str
    log_path: str
    addresses: tuple[str, ...]


def short_id(container_id: str) -> str:
    """The 12-character form `docker ps` and `crictl ps` print, for labels and messages."""
    return container_id[:12]


# --------------------------------------------------------------------------------------------------------------
# /proc/PID/cgroup


def parse_cgroup(text: str) -> Placement:
    """Classify a process from the content of `/proc/PID/cgroup` (cgroups(7): `ID:controllers:path` lines).

    The `0::` (v2) line comes first when its path is not the root, then v1 lines, `name=systemd`, `pids`,
    `memory` and `cpu` first. A line that names a container wins over one that only names a systemd unit,
    which wins over a bare host path: on a hybrid host the unified line of a cgroupfs-driver container can
    show the runtime's own service (`containerd.service`) while the v1 lines show the container.
    """
    best: Placement | None = None
    for path in _candidate_paths(text):
        placement = _classify(path)
        if placement.runtime in ("kubernetes", "docker") or placement.container_id:
            return placement
        if best is None or (best.runtime == "host" and placement.runtime == "systemd"):
            best = placement
    return best if best is not None else Placement("host")


def read_placement(procfs: str, pid: int) -> Placement | None:
    """Read and classify `<procfs>/<pid>/cgroup`; None when it cannot be read (the process is gone, or denied).

    The read is bounded so that a hostile or huge file cannot exhaust memory; undecodable bytes are replaced.
    """
    try:
        fd = os.open(os.path.join(procfs, str(int(pid)), "cgroup"), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        data = _read_bounded(fd, CGROUP_READ_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_cgroup(data.decode("utf-8", errors="replace"))


def _candidate_paths(text: str) -> list[str]:
    """Cgroup paths worth classifying, best first; root and all-`..` paths are dropped."""
    unified: list[str] = []
    legacy: list[tuple[int, int, str]] = []
    for index, line in enumerate(text.splitlines()):
        parts = line.split(":", 2)  # the path itself may hold colons (containerd's `slice:prefix:id` form)
        if len(parts) != 3 or not _path_components(parts[2]):
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            unified.append(path)
        else:
            legacy.append((_v1_rank(controllers), index, path))
    return unified + [path for _, _, path in sorted(legacy)]


def _v1_rank(controllers: str) -> int:
    """Position of a v1 hierarchy in the preference list; unknown hierarchies last."""
    names = controllers.split(",")
    for rank, wanted in enumerate(_V1_PREFERENCE):
        if wanted in names:
            return rank
    return len(_V1_PREFERENCE)


def _path_components(path: str) -> list[str]:
    """Real components of a cgroup path; `..` (a target outside our cgroup namespace) and `.` are dropped."""
    return [c for c in path.strip().split("/") if c not in ("", ".", "..")]


def _classify(path: str) -> Placement:
    """One cgroup path to a Placement.

    Shapes: kubelet's `kubepods[-<qos>]-pod<uid_>.slice` / `kubepods/<qos>/pod<uid>` (kubernetes/kubernetes
    pkg/kubelet/cm/cgroup_manager_linux.go), containerd's `cri-containerd-<id>.scope` and `<slice>:cri-containerd:<id>`
    (containerd/containerd internal/cri/server/helpers.go), CRI-O's `crio-<id>[.scope]` (cri-o/cri-o
    internal/config/cgmgr), Docker's `docker-<id>.scope` and `/docker/<id>` (moby/moby daemon/oci_linux.go).
    """
    components = _path_components(path)
    if any(name == "user.slice" or name.startswith("user@") for name in components):
        # Login sessions and user managers: systemd delegates `user@UID.service` to its user (Delegate=yes), who
        # can make cgroups there named like any container's. No runtime puts one there.
        return Placement("host")
    pod_match = _POD_UID.search(path)
    pod_uid = pod_match.group(1).replace("_", "-") if pod_match else ""
    container_id, prefix, parent = _container_id(components)
    if pod_uid or "kubepods" in path or prefix in _CRI_PREFIXES:
        # Kubernetes, including dockershim (`docker-<id>.scope` or a bare id under kubepods).
        return Placement("kubernetes", container_id, pod_uid)
    if container_id and (prefix == "docker-" or parent == "docker"):
        return Placement("docker", container_id)
    if container_id:
        # Some other runtime (nerdctl, a custom --cgroup-parent): keep the id, the runtime is unknown.
        return Placement("host", container_id)
    unit = _system_unit(components)
    return Placement("systemd", unit=unit) if unit else Placement("host")


def _container_id(components: list[str]) -> tuple[str, str, str]:
    """(id, prefix, parent component) of the innermost component that names a container, else empties.

    A component names a container when, after the last `:` and without `.scope` and one runtime prefix, it is
    exactly 64 hex. That rejects what cAdvisor and the Datadog agent skip by name (google/cadvisor
    container/crio/factory.go, DataDog/datadog-agent pkg/util/cgroups/reader.go): `.mount` units and CRI-O's
    monitor `crio-conmon-<id>.scope`. Walking up copes with a process in a sub-cgroup of its container.
    """
    for index in range(len(components) - 1, -1, -1):
        name = components[index].rsplit(":", 1)[-1]  # `<slice>:cri-containerd:<id>` (containerd cri/server/helpers.go)
        name = name.removesuffix(".scope")
        prefix = next((p for p in _ID_PREFIXES if name.startswith(p)), "")
        candidate = name[len(prefix) :]
        if _HEX64.fullmatch(candidate):
            return candidate, prefix, components[index - 1] if index else ""
    return "", "", ""


def _system_unit(components: list[str]) -> str:
    """The outermost `.service` component: the unit systemd itself manages (systemd.special(7)).

    (Anything under `user.slice` or a `user@N.service` manager, a login session or a user unit whose journal
    entries carry `_SYSTEMD_USER_UNIT`, is the host: `_classify`.)
    """
    for name in components:
        if name.endswith(".service"):
            return name if _UNIT.fullmatch(name) else ""
    return ""


# --------------------------------------------------------------------------------------------------------------
# Paths under rootfs


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


def _node_join(*parts: str) -> str:
    """A normalized absolute node path; `..` cannot climb above `/` (and POSIX's special `//` is folded)."""
    return "/" + posixpath.normpath("/" + "/".join(parts)).lstrip("/")


def _listdir(rootfs: str, node_dir: str) -> list[str]:
    """Names in a node directory, sorted; [] when it is missing or unreadable."""
    host = rootfs_path(rootfs, node_dir)
    if host is None:
        return []
    try:
        return sorted(os.listdir(host))
    except (OSError, ValueError):
        return []


def _stat_in(rootfs: str, node_path: str) -> os.stat_result | None:
    """stat of a node path after resolving it inside rootfs; None when absent."""
    host = rootfs_path(rootfs, node_path)
    if host is None:
        return None
    try:
        return os.lstat(host)
    except (OSError, ValueError):
        return None


def _is_dir(rootfs: str, node_path: str) -> bool:
    st = _stat_in(rootfs, node_path)
    return st is not None and stat.S_ISDIR(st.st_mode)


# --------------------------------------------------------------------------------------------------------------
# Kubernetes: the kubelet's log tree


def find_pod_container(
    rootfs: str, pod_logs: str, container_logs: str, container_id: str, pod_uid: str
) -> PodContainer | None:
    """Namespace, pod, container and current log of a Kubernetes container, from the kubelet's log tree only.

    First the legacy link `<container_logs>/<pod>_<ns>_<ctr>-<id>.log` -> `<pod_logs>/<ns>_<pod>_<uid>/<ctr>/<N>.log`
    (kubernetes/kubernetes pkg/kubelet/kuberuntime/legacy.go and helpers.go); when that name was truncated or
    is missing, the pod's directory `<pod_logs>/*_<uid>` (see :func:`_from_pod_dir`). None when neither works.
    """
    pod_uid = pod_uid.replace("_", "-")
    pod_logs = _node_join(pod_logs)
    if container_id:
        found = _from_link(rootfs, pod_logs, _node_join(container_logs), container_id, pod_uid)
        if found is not None:
            return found
    if pod_uid:
        return _from_pod_dir(rootfs, pod_logs, _node_join(container_logs), container_id, pod_uid)
    return None


def current_pod_log(rootfs: str, log_dir: str) -> tuple[str, int] | None:
    """(node path, restart) of the highest `<N>.log` in a container's log dir; None when there is none.

    Rotated files (`N.log.20261129-101500`, `.gz`, `.tmp`: kubernetes/kubernetes
    pkg/kubelet/logs/container_log_manager.go) are ignored; a container restart adds `(N+1).log`.
    """
    log_dir = _node_join(log_dir)
    best: tuple[int, str] | None = None
    for name in _listdir(rootfs, log_dir):
        match = _RESTART_LOG.fullmatch(name)
        if match is None:
            continue
        restart = int(match.group(1))
        if best is not None and restart <= best[0]:
            continue
        st = _stat_in(rootfs, posixpath.join(log_dir, name))
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
    for name in _listdir(rootfs, container_logs):
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
    return _node_join(target) if target.startswith("/") else _node_join(posixpath.dirname(node_link), target)


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
    if not _is_dir(rootfs, log_dir):
        return None
    return PodContainer(namespace, pod, uid, container, int(match.group(1)), target, log_dir)


def _from_pod_dir(
    rootfs: str, pod_logs: str, container_logs: str, container_id: str, pod_uid: str
) -> PodContainer | None:
    """Step (b): `<pod_logs>/*_<uid>/<ctr>/`, choosing among several containers as :func:`_pick_container` says."""
    for pod_dir_name in _listdir(rootfs, pod_logs):
        names = _split_pod_dir(pod_dir_name)
        if names is None or names[2] != pod_uid:
            continue
        namespace, pod, uid = names
        pod_dir = posixpath.join(pod_logs, pod_dir_name)
        containers = [c for c in _listdir(rootfs, pod_dir) if _is_dir(rootfs, posixpath.join(pod_dir, c))]
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
        stems = [n[: -len(".log")] for n in _listdir(rootfs, container_logs) if n.startswith(f"{pod}_{namespace}_")]
        fitting = [c for c in containers if any(_link_fits(s, pod, namespace, c, container_id) for s in stems)]
        if len(fitting) == 1:
            return fitting[0]
    newest: tuple[float, str] | None = None
    for container in containers:
        st = _stat_in(rootfs, posixpath.join(pod_dir, container))
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


# --------------------------------------------------------------------------------------------------------------
# Docker


def read_docker(rootfs: str, docker_root: str, container_id: str) -> DockerContainer | None:
    """Name, log driver, json-file path and addresses of a Docker container from its state directory.

    `<docker_root>/containers/<id>/` holds `config.v2.json` (Name, NetworkSettings) and `hostconfig.json`
    (LogConfig), and json-file writes `<id>-json.log` there (moby/moby daemon/container/container.go).
    None when the directory is absent or the ID is not 64 lowercase hex.
    """
    if not _HEX64.fullmatch(container_id):
        return None
    node_dir = _node_join(docker_root, "containers", container_id)
    if not _is_dir(rootfs, node_dir):
        return None
    config = _read_json(rootfs, posixpath.join(node_dir, "config.v2.json"))
    hostconfig = _read_json(rootfs, posixpath.join(node_dir, "hostconfig.json"))
    return DockerContainer(
        id=container_id,
        name=_docker_name(config),
        log_driver=_docker_log_driver(hostconfig),
        log_path=posixpath.join(node_dir, f"{container_id}-json.log"),
        addresses=_docker_addresses(config),
    )


class _Missing:
    """Marker for a JSON file that does not exist (as opposed to one that cannot be parsed)."""


_MISSING = _Missing()


def _read_json(rootfs: str, node_path: str) -> object:
    """Parsed JSON, `_MISSING` when the file is absent, or None when it is unreadable, too big or malformed."""
    host = rootfs_path(rootfs, node_path)
    if host is None:
        return _MISSING if _is_missing(rootfs, node_path) else None
    try:
        # O_NONBLOCK: a FIFO planted under that name must not hang the exporter; O_NOFOLLOW: no late link swap.
        fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return _MISSING
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_bounded(fd, JSON_READ_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
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


def _docker_name(config: object) -> str:
    """`Name` without its leading `/`; "" when absent or not a string."""
    name = config.get("Name") if isinstance(config, dict) else None
    return name.removeprefix("/") if isinstance(name, str) else ""


def _docker_log_driver(hostconfig: object) -> str:
    """`LogConfig.Type`; json-file (moby's DefaultLogDriver) when the file or the key is absent, else "unknown"."""
    if isinstance(hostconfig, _Missing):
        return "json-file"
    if not isinstance(hostconfig, dict):
        return "unknown"
    log_config = hostconfig.get("LogConfig")
    if log_config is None:
        return "json-file"
    if not isinstance(log_config, dict):
        return "unknown"
    driver = log_config.get("Type")
    if driver is None or driver == "":
        return "json-file"
    return driver if isinstance(driver, str) else "unknown"


def _docker_addresses(config: object) -> tuple[str, ...]:
    """Valid, distinct `IPAddress` / `GlobalIPv6Address` values of every network in `NetworkSettings.Networks`."""
    settings = config.get("NetworkSettings") if isinstance(config, dict) else None
    networks = settings.get("Networks") if isinstance(settings, dict) else None
    if not isinstance(networks, dict):
        return ()
    found: list[str] = []
    for network in networks.values():
        if not isinstance(network, dict):
            continue
        for key in ("IPAddress", "GlobalIPv6Address"):
            value = network.get(key)
            if not isinstance(value, str) or not value:
                continue
            try:
                address = str(ipaddress.ip_address(value))
            except ValueError:
                continue
            if address not in found:
                found.append(address)
    return tuple(found)


# --------------------------------------------------------------------------------------------------------------


def _read_bounded(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd`; /proc files may return short reads, so loop until EOF or the cap."""
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(65536, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
