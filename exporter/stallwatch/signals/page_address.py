"""Where a server's own pages are fetched from: the health probe's address (an address of the server's own,
`discovery.server`), with the page's path."""

from __future__ import annotations

from urllib.parse import urlsplit

from stallwatch.discovery.server import Server


def page_url(server: Server, path: str, port: int | None = None) -> tuple[str, bool] | None:
    """The URL of the server's page at `path` (on `port`, a port of its own, else the probe's), at the health probe's
    address, and whether it was derived from its command line; None when it cannot be fetched from here (no probe,
    or loopback only in its own namespace)."""
    launch = server.launch
    if not launch.probes:
        return None
    target = launch.probes[0]
    if target.netns_pid is not None:
        return None
    parts = urlsplit(target.probe.url)._replace(path=path, query="")
    if port is not None and parts.hostname is not None:
        host = parts.hostname
        parts = parts._replace(netloc=f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return parts.geturl(), target.derived
