"""Which prefill/decode (PD) disaggregated group a server belongs to, and as what: `prefill` or `decode` from its
command line (`engines.base.Disaggregation`), or `router` for a router (`engines.base.Router`).

A PD group is the set of prefill and decode servers that one router, one Dynamo graph or one configured name pairs;
it is not a multi-node `deployment` (a member may be both). P and D share no key on their command lines (the pairing
is made per request, research/disaggregation.md section 0.3), so the group is keyed, in order of trust:
1. the server's configured `pd_group`;
2. the Kubernetes graph deployment that NVIDIA Dynamo's operator names in every component container's environment
   (`DYN_PARENT_DGD_K8S_NAMESPACE`/`DYN_PARENT_DGD_K8S_NAME`, the `nvidia.com/dynamo-graph-deployment-name` label's
   value; ai-dynamo/dynamo operator `getCommonContainer`); pod labels themselves (llm-d's `llm-d.ai/role`) are not
   readable from files;
3. the Dynamo namespace (`DYN_NAMESPACE`, `dynamo/common/configuration/groups/runtime_args.py:216-223`) and the model;
4. a router on the same node that lists the member (its command line, else its metrics page's workers), by the
   router's name on this node.
A member that none of these places has no group (`pd_group=""`): a router elsewhere pairs it, and no rule judges it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from stallwatch.discovery.deployment import KEY_OUTSIDE, MAX_KEY_CHARS
from stallwatch.engines.base import Engine

DYNAMO_KEYS = ("DYN_PARENT_DGD_K8S_NAMESPACE", "DYN_PARENT_DGD_K8S_NAME", "DYN_NAMESPACE")
LOCAL_NAMES = ("localhost", "0.0.0.0", "::", "")


@dataclass(frozen=True)
class PdPlace:
    """A server's place in a PD group as its own process says: its role, and its group key ("" when only a router
    can say)."""

    role: str  # prefill | decode | router; "" where only a router that lists it gives it (vLLM's `kv_both`)
    key: str = ""
    routes: tuple[tuple[str, str, int], ...] = ()  # a router's members from its command line: (role, host, port)


def place(engine: Engine, argv: Sequence[str], environ: Mapping[str, str], configured: str | None,
          model: str, configured_role: str | None = None) -> PdPlace | None:
    """The server's PD place; None for a server that is neither a PD member nor a router. `configured_role`, the
    server's configured `pd_role`, stands before its command line's (llm-d's vLLM runs `kv_both`: only its pod's
    `llm-d.ai/role` label, which the node cannot read, says which side it is)."""
    spec = engine.disaggregation
    if engine.router is not None:
        role, routes = "router", tuple(engine.router.members(argv))
    else:
        role, routes = configured_role or (spec.role(argv) if spec is not None else ""), ()
    if not role and (spec is None or not spec.member(argv)):
        return None
    key = configured or ""
    if not key and environ.get("DYN_PARENT_DGD_K8S_NAME"):
        key = "/".join(filter(None, (environ.get("DYN_PARENT_DGD_K8S_NAMESPACE"), environ["DYN_PARENT_DGD_K8S_NAME"])))
    if not key and environ.get("DYN_NAMESPACE") and model:
        key = f"{environ['DYN_NAMESPACE']}/{model}"
    return PdPlace(role, KEY_OUTSIDE.sub("_", key[:MAX_KEY_CHARS]), routes)


@dataclass(frozen=True)
class Seen:
    """What the grouping needs of one watched server."""

    name: str
    place: PdPlace
    host: str
    port: int | None
    workers: tuple[str, ...] = ()  # a router's workers from its metrics page (URLs)


def groups(servers: Iterable[Seen], node: str) -> dict[str, tuple[str, str]]:
    """Each PD member's and router's group key and role by server name (key "" where none is known; role "" where
    neither its command line nor a router's lists give it); `node` names this node in the key of a group that only a
    router on it makes."""
    seen = list(servers)
    out = {s.name: (s.place.key, s.place.role) for s in seen}
    for router in (s for s in seen if s.place.role == "router"):
        listed = list(router.place.routes)
        listed += [("", *address) for url in router.workers if (address := _address(url)) is not None]
        # Each member it lists, with the role its lists give it ("" from its metrics page: a URL without a role).
        members = [(m, next((role for role, host, port in listed if role and _lists(m, host, port)), ""))
                   for m in seen if m.place.role != "router" and any(_lists(m, host, port) for _, host, port in listed)]
        key = router.place.key or next((m.place.key for m, _ in members if m.place.key), "") or KEY_OUTSIDE.sub(
            "_", f"{node}/{router.name}"[:MAX_KEY_CHARS])
        out[router.name] = (key, "router")
        for member, role in members:
            own_key, own_role = out[member.name]
            out[member.name] = (own_key or key, own_role or role)
    return out


def route_role(place: PdPlace, worker: str) -> str:
    """The role a router's command line gives the worker its metrics page names by URL; "" for a worker it does not
    list (one registered at run time)."""
    address = _address(worker)
    return next((role for role, host, port in place.routes if (host, port) == address), "")


def _address(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url if "//" in url else f"//{url}")
    try:
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname or "", port) if port is not None else None


def _lists(member: Seen, host: str, port: int) -> bool:
    """Whether a router's `host:port` is this member on this node: its port, and a host that is this node's (a
    loopback or wildcard address, or the host the member was told to bind)."""
    if member.port != port:
        return False
    if host in LOCAL_NAMES or host == member.host:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
