"""The deployment collector, from looks: a member of a deployment over several nodes says which, what it is and its
rank processes against the most it had; a single-node server adds nothing. A worker node counts only once its
launch has held GPU memory or served: another process that copies its argv and sleeps is no node of it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from prometheus_client.core import Metric

from stallwatch.collectors.deployment import DeploymentCollector
from stallwatch.discovery.deployment import Member
from stallwatch.discovery.processes import ProcessKey
from stallwatch.discovery.server import Launch
from stallwatch.signals.devices import Device, Devices
from support.looks import Looked, look, phase, proc

WORKER = Member("llm/kimi", "worker", 1, 2)
SERVING = dataclasses.replace(phase(), phase="serving", timeline=("launching", "loading_weights", "serving"))


def _collector(*servers: Looked, held: dict[int, float] | None = None) -> DeploymentCollector:
    watcher = SimpleNamespace(servers=lambda: list(servers))
    gpu = Device("0", "GPU-0", "NVIDIA H100 80GB HBM3", sum((held or {}).values()), 80e9, 0.0, held or {})
    nvml = SimpleNamespace(read_devices=lambda: Devices(True, devices=[gpu]))
    return DeploymentCollector(watcher, nvml)  # type: ignore[arg-type]


def _families(collector: DeploymentCollector) -> dict[str, Metric]:
    return {f.name: f for f in collector.collect()}


def _launch(member: Member, pid: int = 42) -> Launch:
    return Launch(key=ProcessKey(pid, 1.7e9), member=member)


def test_a_worker_node_that_lost_a_rank_says_so() -> None:
    families = _families(_collector(
        Looked(look("kimi-1", launch=_launch(WORKER), ranks=(7, 8), log=SERVING)), Looked(look("single"))))
    info = families["stallwatch_deployment_member_info"].samples
    assert [s.labels for s in info] == [{"server": "kimi-1", "deployment": "llm/kimi", "role": "worker",
                                         "node_rank": "1", "nnodes": "2"}]
    assert [s.labels["node_rank"] for s in families["stallwatch_deployment_node_expected"].samples] == ["0", "1"]
    assert [s.value for s in families["stallwatch_probe_authoritative"].samples] == [0.0]  # the head's judges
    assert [s.value for s in families["stallwatch_deployment_member_ranks"].samples] == [7]
    assert [s.value for s in families["stallwatch_deployment_member_ranks_started"].samples] == [8]


def test_a_member_whose_ranks_are_not_counted_has_no_rank_series() -> None:
    head = Looked(look("kimi-0", launch=_launch(Member("llm/kimi", "head", 0, 2)), running=False))
    families = _families(_collector(head))
    assert [s.value for s in families["stallwatch_probe_authoritative"].samples] == [1.0]
    assert families["stallwatch_deployment_member_ranks"].samples == []


def test_a_head_is_a_member_from_its_start() -> None:
    """Its wait at the rendezvous, before it holds anything, is what InferenceDeploymentIncomplete reads."""
    head = Looked(look("kimi-0", launch=_launch(Member("llm/kimi", "head", 0, 2)), ranks=(8, 8)))
    families = _families(_collector(head))
    assert [s.labels["role"] for s in families["stallwatch_deployment_member_info"].samples] == ["head"]
    assert len(families["stallwatch_deployment_node_expected"].samples) == 2


def test_another_users_head_counts_once_it_held_gpu_memory() -> None:
    """A user other than root, outside a pod, starts a sleeper with a head's argv: its deployment is its own
    (`@uid1001`), and it would page InferenceDeploymentIncomplete at will. It waits like a worker: no member until its
    tree holds GPU memory (a real head does before its rendezvous: SGLang's `init_torch_distributed` sets its device
    first) or serves."""
    head = Member("10.9.9.9:5000@uid1001", "head", 0, 2, unprivileged=True)
    sleeper = Looked(look("sglang-40003@uid1001", launch=_launch(head), tree=[proc(42)]))
    families = _families(_collector(sleeper, held={4242: 70e9}))
    assert families["stallwatch_deployment_member_info"].samples == []
    assert families["stallwatch_deployment_node_expected"].samples == []
    families = _families(_collector(sleeper, held={42: 5e8}))  # its CUDA context
    assert [s.labels["role"] for s in families["stallwatch_deployment_member_info"].samples] == ["head"]


def test_a_worker_that_never_held_gpu_memory_nor_served_is_no_node() -> None:
    """Audit 2026-12-02 #1: a sleeper with a worker's argv. Not present (InferenceDeploymentIncomplete stays), and
    nothing to lose when it goes (no InferenceDeploymentMemberLost): no member info, expected ranks or rank counts."""
    sleeper = Looked(look("sglang-40001", launch=_launch(WORKER), tree=[proc(42)], ranks=(8, 8)))
    collector = _collector(sleeper, held={4242: 70e9})  # another process's memory is not its own
    for _ in range(2):
        families = _families(collector)
        for name in ("info", "node_expected", "member_ranks", "member_ranks_started"):
            prefix = "stallwatch_deployment_" + ("member_" if name == "info" else "")
            assert families[prefix + name].samples == [], name
        assert [s.value for s in families["stallwatch_probe_authoritative"].samples] == [0.0]
    sleeper.now = dataclasses.replace(sleeper.now, running=False, tree=())
    assert _families(collector)["stallwatch_deployment_member_info"].samples == []


def test_a_worker_seen_holding_gpu_memory_stays_a_node_for_its_launch() -> None:
    """Once seen loaded, it stays present, also once its process is gone (InferenceDeploymentMemberLost); a new
    launch of the server must hold memory or serve again."""
    worker = Looked(look("kimi-1", launch=_launch(WORKER), tree=[proc(42), proc(43, role="scheduler_TP8")]))
    collector = _collector(worker, held={43: 70e9})
    assert len(_families(collector)["stallwatch_deployment_member_info"].samples) == 1
    worker.now = dataclasses.replace(worker.now, running=False, tree=())  # gone: holds nothing
    assert len(_families(collector)["stallwatch_deployment_member_info"].samples) == 1
    worker.now = dataclasses.replace(worker.now, running=True, tree=(proc(50),), launch=_launch(WORKER, pid=50))
    assert _families(collector)["stallwatch_deployment_member_info"].samples == []
