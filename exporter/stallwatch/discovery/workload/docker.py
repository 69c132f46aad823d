"""A Docker container as its state directory describes it (`config.v2.json`, `hostconfig.json`), read under
`--path.rootfs` without dockerd's socket; the files are the container owner's input, parsed defensively.
"""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import dataclass

from stallwatch.discovery.workload.cgroup import CONTAINER_ID
from stallwatch.discovery.workload.rootfs import MISSING, is_dir, node_join, read_json

__all__ = ["DockerContainer", "read_docker"]


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

def read_docker(rootfs: str, docker_root: str, container_id: str) -> DockerContainer | None:
    """Name, log driver, json-file path and addresses of a Docker container from its state directory.

    `<docker_root>/containers/<id>/` holds `config.v2.json` (Name, NetworkSettings) and `hostconfig.json`
    (LogConfig), and json-file writes `<id>-json.log` there (moby/moby daemon/container/container.go).
    None when the directory is absent or the ID is not 64 lowercase hex.
    """
    if not CONTAINER_ID.fullmatch(container_id):
        return None
    node_dir = node_join(docker_root, "containers", container_id)
    if not is_dir(rootfs, node_dir):
        return None
    config = read_json(rootfs, posixpath.join(node_dir, "config.v2.json"))
    hostconfig = read_json(rootfs, posixpath.join(node_dir, "hostconfig.json"))
    return DockerContainer(
        id=container_id,
        name=_docker_name(config),
        log_driver=_docker_log_driver(hostconfig),
        log_path=posixpath.join(node_dir, f"{container_id}-json.log"),
        addresses=_docker_addresses(config),
    )

def _docker_name(config: object) -> str:
    """`Name` without its leading `/`; "" when absent or not a string."""
    name = config.get("Name") if isinstance(config, dict) else None
    return name.removeprefix("/") if isinstance(name, str) else ""


def _docker_log_driver(hostconfig: object) -> str:
    """`LogConfig.Type`; json-file (moby's DefaultLogDriver) when the file or the key is absent, else "unknown"."""
    if hostconfig is MISSING:
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
