"""A PD router's own view, from its metrics page (a port of its own, `engines.base.Router`): each worker's health as
the router sees it and its requests in flight. Fetched by the engine-page loop of the router (`signals.engine_page`),
only while the router's own process tree listens on that port: a `--prometheus-port` in another user's argv never
makes the exporter fetch someone else's port."""

from __future__ import annotations

import math
from typing import NamedTuple

from stallwatch.discovery import netns
from stallwatch.discovery.server import Server
from stallwatch.signals.probes import fetch
from stallwatch.signals.textformat import PAIRS, SAMPLE, sample_lines

MAX_BODY_BYTES = 1 << 20  # a router's page: a few series per worker
MAX_WORKERS = 256


class RouterView(NamedTuple):
    """Whether its page answered; each worker URL's health (1 healthy, 0 not) and the requests in flight over its
    workers (None: the page has no such series)."""

    up: bool
    workers: dict[str, float]
    running: float | None


def read_router(server: Server, timeout: float) -> RouterView | None:
    """One read of the router's metrics page; None when it has none to read from here (the mini_lb, the toy proxy,
    a port its tree does not listen on)."""
    router, launch = server.engine.router, server.launch
    port = router.metrics_port(launch.flags) if router is not None else None
    if router is None or port is None:
        return None
    listeners = server.own_listeners(port=port)
    key = launch.key
    # From the exporter's own network namespace only: a loopback address elsewhere is another host's.
    if not listeners or key is None or not netns.same_netns(server.procfs, key.pid):
        return None
    address = listeners[0].address
    host = "127.0.0.1" if address in ("0.0.0.0", "::") else address
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
    result, body = fetch(url, timeout, MAX_BODY_BYTES)
    if not result.success or body is None:
        return RouterView(False, {}, None)
    return parse_router(body, router.worker_health, router.worker_labels, router.running)


def parse_router(body: bytes, health: str, labels: tuple[str, ...], running: str) -> RouterView:
    """Worker health by its label's value (the largest over other labels), and the sum of `running`."""
    workers: dict[str, float] = {}
    total: float | None = None
    wanted = {label.encode() for label in labels}
    for line in sample_lines([name for name in (health, running) if name]).finditer(body):
        sample = SAMPLE.fullmatch(line.group(2))
        if sample is None:
            continue
        try:
            value = float(sample.group("value"))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        if line.group(1).decode() == running:
            total = (total or 0.0) + value
            continue
        worker = next((v for k, v in PAIRS.findall(sample.group("labels") or b"") if k in wanted), None)
        if worker is not None and (worker in workers or len(workers) < MAX_WORKERS):
            key = worker.decode("utf-8", "replace")
            workers[key] = max(workers.get(key, value), value)
    return RouterView(True, workers, total)
