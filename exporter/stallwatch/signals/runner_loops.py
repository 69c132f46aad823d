"""Whether the main loops of a server's runners answer (`Engine.runner_loops`: Ollama's llama-server per loaded
model), fetched by the engine page loop (`signals.engine_page`) beside the server's own pages: each runner's page on
the port its command line gives, at the server's own loopback, one at a time, each within the page deadline.

Only where the exporter shares the server's loopback (its health probe's address is a loopback one and needs no
entering of its namespace): a runner binds `127.0.0.1`, which another network namespace's exporter cannot reach.
Bounded: at most MAX_RUNNERS runners a fetch, a few bytes read of each answer (the status is what counts)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

import psutil

from stallwatch.discovery.processes import role_name
from stallwatch.discovery.server import Server
from stallwatch.engines.base import RunnerLoops
from stallwatch.signals.page_address import page_url
from stallwatch.signals.probes import fetch

MAX_RUNNERS = 32  # Ollama loads at most OLLAMA_MAX_LOADED_MODELS at once: 3 per GPU by default
MAX_BODY_BYTES = 1 << 16  # the slots' JSON; only the answer's coming counts


def runner_port(argv: Sequence[str], spec: RunnerLoops) -> int | None:
    """The port a runner's command line gives (`--port N` or `--port=N`); None when none, or not a port."""
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg == spec.port_flag and i + 1 < len(argv) else (
            arg.removeprefix(f"{spec.port_flag}=") if arg.startswith(f"{spec.port_flag}=") else None)
        if value is not None:
            return int(value) if value.isascii() and value.isdigit() and 0 < int(value) < 65536 else None
    return None


def _runner_ports(server: Server, spec: RunnerLoops) -> list[int]:
    main = server.launch.process
    if main is None:
        return []
    ports = []
    for pid in server.table.descendants(main.pid):
        try:
            process = psutil.Process(pid)
            argv, comm = process.cmdline(), process.name()
        except psutil.Error:  # gone, or unreadable: no runner of ours to ask
            continue
        port = runner_port(argv, spec) if role_name(argv, comm, server.engine.role_title) == spec.role else None
        if port is not None and port not in ports:
            ports.append(port)
    return ports[:MAX_RUNNERS]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_runner_loops(server: Server, timeout: float) -> bool | None:
    """False when a runner's page timed out (its loop holds the request), True when every runner asked answered
    (any status), None when none was asked (no runner, no such page, not reachable from here) or a refusal (a
    runner starting or ending) says nothing of its loop."""
    spec = server.engine.runner_loops
    found = page_url(server, spec.path) if spec is not None else None
    if spec is None or found is None:
        return None
    host = urlsplit(found[0]).hostname
    if host is None or not _loopback(host):
        return None
    netloc = f"[{host}]" if ":" in host else host
    answered = None
    for port in _runner_ports(server, spec):
        result, _ = fetch(f"http://{netloc}:{port}{spec.path}", timeout, MAX_BODY_BYTES)
        if result.reason == "timeout":
            return False
        if result.status:
            answered = True
    return answered
