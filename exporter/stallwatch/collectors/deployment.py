"""Deployment collector: each server that is one node of a deployment over several, as what (head or worker), which
node ranks the deployment expects, whether its health probe judges it, and its rank processes now against the most
it had. Only members appear: a single-node server adds nothing here."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.watcher import Watcher


class DeploymentCollector:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        info, expected = family("deployment_member_info"), family("deployment_node_expected")
        authoritative = family("probe_authoritative")
        ranks, started = family("deployment_member_ranks"), family("deployment_member_ranks_started")
        for server in self.watcher.servers():
            look = server.look()
            member = look.launch.member
            if member is None:
                continue
            info.add_metric([look.name, member.deployment, member.role, str(member.node_rank), str(member.nnodes)],
                            1.0)
            for rank in range(member.nnodes):
                expected.add_metric([look.name, member.deployment, str(rank)], 1.0)
            # A worker's `/health` is a constant (SGLang's dummy) or absent (vLLM headless): the head's judges.
            authoritative.add_metric([look.name], 0.0 if member.worker else 1.0)
            if look.ranks is not None:
                ranks.add_metric([look.name], look.ranks[0])
                started.add_metric([look.name], look.ranks[1])
        yield from (info, expected, authoritative, ranks, started)


COLLECTOR = Registration("deployment", CollectorSettings, lambda runtime, _: DeploymentCollector(runtime.watcher),
                         "each server's place in a deployment over several nodes")
