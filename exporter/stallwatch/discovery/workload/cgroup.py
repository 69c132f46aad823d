"""What runs a process, from its `/proc/PID/cgroup` alone: a Kubernetes or Docker container (its ID and pod UID), a
systemd unit, or the host. The file names cgroups that other users can create and name (a delegated subtree), so
the parser treats it as hostile and returns a neutral value instead of raising; `discovery.workload.locate` believes
a container's name only for a process in a container's mount namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stallwatch.procfs import pid_path, read_bounded

__all__ = ["CONTAINER_ID", "Placement", "parse_cgroup", "read_placement", "short_id"]

CGROUP_READ_LIMIT = 64 * 1024
CONTAINER_ID = re.compile(r"[0-9a-f]{64}")  # what every runtime here names a container by
# Pixie's pattern (pixie-io/pixie src/shared/metadata/cgroup_path_resolver.cc) plus the 32-hex UID of static pods;
# anchored so that `pod` inside another word, or a longer hex run, does not match.
_POD_UID = re.compile(
    r"(?:^|[/_.-])pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"
    r"(?![0-9a-f])"
)
# Characters systemd allows in unit names (systemd.unit(5)), so a unit can go into a journal match safely.
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]{1,247}\.service")
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


def short_id(container_id: str) -> str:
    """The 12-character form `docker ps` and `crictl ps` print, for labels and messages."""
    return container_id[:12]

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
        data = read_bounded(pid_path(procfs, pid, "cgroup"), CGROUP_READ_LIMIT)
    except (OSError, ValueError):
        return None
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
        if CONTAINER_ID.fullmatch(candidate):
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
