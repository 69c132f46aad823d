"""Which multi-node deployment a server belongs to, and as what, from its process alone (no config): its role
(`head` or `worker`), node rank, node count and a deployment key that every node of one deployment shares.

A server is a member when its command line says so (`engines/*`: `MultiNode`; a node count above 1, data-parallel
ranks over several nodes, `--headless`). Its key is the LeaderWorkerSet leader address that the LWS pod webhook
injects into every container of a group (kubernetes-sigs/lws `pkg/utils/pod/pod_utils.go`: `LWS_LEADER_ADDRESS`,
with `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX`), else the engine's rendezvous address from its command line. The
environment alone makes no member: a vLLM head that runs its ranks as Ray actors is one server under an LWS of
two pods, and its workers run only `ray start`. The environment is another user's input: only the LWS keys (and an
engine's listen address, `Engine.address_env`) are taken, from a bounded read, each value bounded, the key cut to
address characters.

Both the command line and the environment are chosen by whoever starts the process, so the key also says who runs
it (docs/research/audit-2026-12-02.md #1): `@ns/<namespace>` for a container of a Kubernetes pod, `@uid<N>` for any
other process of a user other than root (`owner_suffix`). Two members join only when that is equal too: another
user's process that copies a deployment's rendezvous address is a deployment of its own. The LWS keys are read only
from a pod's container (the webhook sets them there; on the host they are anyone's words).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stallwatch.discovery.workload import Workload
from stallwatch.engines.base import Engine, whole_number
from stallwatch.procfs import pid_path, read_bounded

LWS_KEYS = ("LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX")
MAX_ENVIRON_BYTES = 256 * 1024  # where the keys must be found: a container's environment is a few KiB
MAX_KEY_CHARS = 260  # a DNS name (253) and a port
# A key is an address (a DNS name, an IPv4 or bracketed IPv6 address, a port): anything else another process wrote
# there becomes `_`, so that it can be quoted in a PromQL selector of an alert template.
KEY_OUTSIDE = re.compile(r"[^A-Za-z0-9.:_\-\[\]/]")
MAX_NODES = 256  # node counts above it are not believed (a deployment's node_expected series per node rank)


@dataclass(frozen=True)
class Member:
    """One server as a node of a multi-node deployment."""

    deployment: str
    role: str  # head | worker
    node_rank: int
    nnodes: int
    # Run by a user other than root outside a pod: any local user can start one, with any argv.
    unprivileged: bool = False

    @property
    def worker(self) -> bool:
        return self.role == "worker"


def environ_keys(engine: Engine) -> tuple[str, ...]:
    """What of a server's environment is read: the LWS keys, and the engine's listen address (`address_env`,
    `port_env`)."""
    return (*LWS_KEYS, *(key for key in (engine.address_env, engine.port_env) if key))


def read_environ(procfs: str, pid: int, keys: Sequence[str] = LWS_KEYS) -> dict[str, str]:
    """The values of `keys` in the environment process `pid` was started with; {} when unreadable."""
    try:
        data = read_bounded(pid_path(procfs, pid, "environ"), MAX_ENVIRON_BYTES)
    except (OSError, ValueError):
        return {}
    wanted = {key.encode() + b"=": key for key in keys}
    found: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, _ = entry.partition(b"=")
        key = wanted.get(name + sep)
        if key is not None and key not in found:
            found[key] = entry[len(name) + 1:][:MAX_KEY_CHARS].decode("ascii", "replace")
    return found


def owner_suffix(workload: Workload, uid: int | None) -> str | None:
    """Who runs a member, as its key's tail: the pod's namespace for a Kubernetes container (pods of one deployment
    share it, and only its own tenant makes pods there; their uid is mostly 0 on every node), else the uid of the
    main process, empty for root's (root could take any key anyway). None when it cannot be told (the process is
    gone): no member then. `/` never occurs in a namespace or a uid, so the two kinds cannot meet."""
    if workload.runtime == "kubernetes" and workload.namespace:
        return f"@ns/{KEY_OUTSIDE.sub('_', workload.namespace[:MAX_KEY_CHARS])}"
    if uid is None:
        return None
    return "" if uid == 0 else f"@uid{uid}"


def membership(engine: Engine, argv: Sequence[str], environ: Mapping[str, str], workload: Workload,
               uid: int | None) -> Member | None:
    """The server's place in a multi-node deployment; None for a server on one node. `workload` and `uid` (the real
    uid of its main process) say who runs it: they end its key, and only a pod's environment is read."""
    spec = engine.multinode
    nnodes = node_rank = None
    headless = False
    key = ""
    if spec is not None:
        nnodes, node_rank = spec.number(argv, spec.nnodes_flags), spec.number(argv, spec.node_rank_flags)
        local = spec.number(argv, spec.dp_local_flags)
        size = spec.number(argv, spec.dp_size_flags)
        if (nnodes is None or nnodes <= 1) and local and size and size > local:
            nnodes = -(-size // local)
            node_rank = (spec.number(argv, spec.dp_start_flags) or 0) // local
        headless = spec.headless(argv)
        key = spec.address(argv)
    owner = owner_suffix(workload, uid)
    if nnodes is None or not 1 < nnodes <= MAX_NODES or owner is None:
        return None
    leader = environ.get("LWS_LEADER_ADDRESS", "") if workload.runtime == "kubernetes" and workload.pod else ""
    if leader and (whole_number(environ.get("LWS_GROUP_SIZE")) or 0) > 1:
        key = leader
        index = whole_number(environ.get("LWS_WORKER_INDEX"))
        node_rank = index if node_rank is None else node_rank
    node_rank = node_rank if node_rank is not None and node_rank < nnodes else 0
    role = "worker" if headless or node_rank > 0 else "head"
    return Member(KEY_OUTSIDE.sub("_", key[:MAX_KEY_CHARS]) + owner, role, node_rank, nnodes,
                  unprivileged=owner.startswith("@uid"))
