"""The deployment collector, from looks: a member of a deployment over several nodes says which, what it is and its
rank processes against the most it had; a single-node server adds nothing."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.core import Metric

from stallwatch.collectors.deployment import DeploymentCollector
from stallwatch.discovery.deployment import Member
from stallwatch.discovery.server import Launch
from support.looks import Looked, look


def _families(*servers: Looked) -> dict[str, Metric]:
    watcher = SimpleNamespace(servers=lambda: list(servers))
    return {f.name: f for f in DeploymentCollector(watcher).collect()}  # type: ignore[arg-type]


def test_a_worker_node_that_lost_a_rank_says_so() -> None:
    member = Member("llm/kimi", "worker", 1, 2)
    families = _families(Looked(look("kimi-1", launch=Launch(member=member), ranks=(7, 8))),
                         Looked(look("single")))
    info = families["stallwatch_deployment_member_info"].samples
    assert [s.labels for s in info] == [{"server": "kimi-1", "deployment": "llm/kimi", "role": "worker",
                                         "node_rank": "1", "nnodes": "2"}]
    assert [s.labels["node_rank"] for s in families["stallwatch_deployment_node_expected"].samples] == ["0", "1"]
    assert [s.value for s in families["stallwatch_probe_authoritative"].samples] == [0.0]  # the head's judges
    assert [s.value for s in families["stallwatch_deployment_member_ranks"].samples] == [7]
    assert [s.value for s in families["stallwatch_deployment_member_ranks_started"].samples] == [8]


def test_a_member_whose_ranks_are_not_counted_has_no_rank_series() -> None:
    families = _families(Looked(look("kimi-0", launch=Launch(member=Member("llm/kimi", "head", 0, 2)), running=False)))
    assert [s.value for s in families["stallwatch_probe_authoritative"].samples] == [1.0]
    assert families["stallwatch_deployment_member_ranks"].samples == []
