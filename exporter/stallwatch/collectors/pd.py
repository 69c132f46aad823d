"""PD collector: each prefill/decode disaggregated group's members by role and group (`discovery.pd`), the requests
its members hold pending in each PD stage (`source="metrics"`: their `/metrics` pages; `source="log"`: their batch
lines) and the KV transfers they completed, and each router's own view of its workers. Only PD members and routers
appear: another server adds nothing here."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.pd import route_role
from stallwatch.discovery.watcher import Watcher
from stallwatch.signals.engine_page import EnginePageManager, PageState
from stallwatch.signals.pd_groups import group_keys, node_name


class PdCollector:
    def __init__(self, watcher: Watcher, pages: EnginePageManager | None, node: str | None = None) -> None:
        self.watcher, self.pages = watcher, pages
        self.node = node or node_name()

    def collect(self) -> Iterator[Metric]:
        info, pending, transfers = family("pd_member_info"), family("engine_requests_pending"), family(
            "engine_kv_transfers_total")
        router_up, worker_up, running = (family("router_metrics_up"), family("router_worker_up"),
                                         family("router_requests_running"))
        states: dict[str, PageState] = {s.server: s for s in self.pages.states()} if self.pages is not None else {}
        looks = [server.look() for server in self.watcher.servers()]
        keys = group_keys(looks, states, self.node)
        for name, (key, role) in keys.items():
            if role:  # a member whose role no router on this node gives is not judged, nor shown
                info.add_metric([name, key, role], 1.0)
        for look in looks:
            if look.launch.pd is None:
                continue
            state = states.get(look.name)
            for stage, value in sorted((look.log.pending or {}).items()):
                pending.add_metric([look.name, "log", stage], value)
            if state is None:
                continue
            for stage, value in sorted((state.pending or {}).items()):
                pending.add_metric([look.name, "metrics", stage], value)
            if state.transfers is not None:
                transfers.add_metric([look.name, "metrics"], state.transfers)
            if state.router is not None:
                router_up.add_metric([look.name], 1.0 if state.router.up else 0.0)
                for worker, value in sorted(state.router.workers.items()):
                    worker_up.add_metric([look.name, worker, route_role(look.launch.pd, worker)], value)
                if state.router.running is not None:
                    running.add_metric([look.name], state.router.running)
        yield from (info, pending, transfers, router_up, worker_up, running)


COLLECTOR = Registration("pd", CollectorSettings,
                         lambda runtime, _: PdCollector(runtime.watcher, runtime.engine_pages),
                         "each prefill/decode disaggregated group's members, pending requests and routers")
