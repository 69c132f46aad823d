"""The PD group of each watched server on this node (`discovery.pd.groups`), from looks at them and their routers'
pages: what the PD collector exports and the reports show."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

from stallwatch.discovery.pd import Seen, groups
from stallwatch.discovery.server import Look
from stallwatch.signals.engine_page import PageState


def node_name() -> str:
    """This node's name in the key of a group that only a router on it makes."""
    return socket.gethostname()


def group_keys(looks: Iterable[Look], states: Mapping[str, PageState], node: str) -> dict[str, tuple[str, str]]:
    """Each PD member's and router's group key and role by server name (`discovery.pd.groups`)."""
    seen = []
    for look in looks:
        if look.launch.pd is None:
            continue
        view = states[look.name].router if look.name in states else None
        seen.append(Seen(look.name, look.launch.pd, look.launch.host, look.launch.port,
                         tuple(view.workers) if view is not None else ()))
    return groups(seen, node)
