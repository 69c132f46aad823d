"""Deployment collector: each server that is one node of a deployment over several, as what (head or worker), which
node ranks the deployment expects, whether its health probe judges it, and its rank processes now against the most
it had. Only members appear: a single-node server adds nothing here.

A worker node appears only once its launch has been seen holding GPU memory or serving (remembered for the
launch, also once its process is gone): the rules count a rank as present, and page when it goes, by its member
info, and a process that only copies a worker's argv (audit 2026-12-02 #1) would otherwise silence
InferenceDeploymentIncomplete while it lives and raise InferenceDeploymentMemberLost when it goes. The head of root's
or a pod's deployment appears from its start, for its wait at the rendezvous is itself what
InferenceDeploymentIncomplete reads; another user's copy of it is a deployment of its own (its key ends with its owner,
`deployment.owner_suffix`). A head that a user other than root runs outside a pod waits like a worker: any local user
can start a sleeper with a head's argv, and it would page InferenceDeploymentIncomplete for its own key at will. A
real head holds GPU memory before its rendezvous (its CUDA context: SGLang's `ModelRunner.init_torch_distributed` sets
its device before `init_distributed_environment`, sgl-project/sglang python/sglang/srt/model_executor/model_runner.py),
so it still pages once it does; on a node without NVML such a head never appears."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.processes import ProcessKey
from stallwatch.discovery.server import Look
from stallwatch.discovery.watcher import Watcher
from stallwatch.signals.devices import Device, server_memory
from stallwatch.signals.nvml import Nvml


class DeploymentCollector:
    def __init__(self, watcher: Watcher, nvml: Nvml | None = None) -> None:
        self.watcher, self.nvml = watcher, nvml
        self._lock = threading.Lock()
        self._established: dict[str, ProcessKey] = {}  # by server: the launch seen holding GPU memory or serving

    def collect(self) -> Iterator[Metric]:
        info, expected = family("deployment_member_info"), family("deployment_node_expected")
        authoritative = family("probe_authoritative")
        ranks, started = family("deployment_member_ranks"), family("deployment_member_ranks_started")
        devices = self._devices()
        looks = [server.look() for server in self.watcher.servers()]
        established = self._note_established(looks, devices)
        for look in looks:
            member = look.launch.member
            if member is None:
                continue
            # A worker's `/health` is a constant (SGLang's dummy) or absent (vLLM headless): the head's judges.
            authoritative.add_metric([look.name], 0.0 if member.worker else 1.0)
            if (member.worker or member.unprivileged) and look.name not in established:
                continue
            info.add_metric([look.name, member.deployment, member.role, str(member.node_rank), str(member.nnodes)],
                            1.0)
            for rank in range(member.nnodes):
                expected.add_metric([look.name, member.deployment, str(rank)], 1.0)
            if look.ranks is not None:
                ranks.add_metric([look.name], look.ranks[0])
                started.add_metric([look.name], look.ranks[1])
        yield from (info, expected, authoritative, ranks, started)

    def _note_established(self, looks: list[Look], devices: list[Device]) -> set[str]:
        """The servers whose current launch has been seen holding GPU memory or serving, this look included;
        servers no longer watched are dropped."""
        with self._lock:
            known = {look.name: self._established.get(look.name) for look in looks}
            for look in looks:
                key = look.launch.key
                if key is not None and look.launch.member is not None and _holds_or_served(look, devices):
                    known[look.name] = key
            self._established = {name: key for name, key in known.items() if key is not None}
            return {look.name for look in looks if look.launch.key is not None
                    and self._established.get(look.name) == look.launch.key}

    def _devices(self) -> list[Device]:
        """The GPUs' last readings (no NVML call); [] without NVML."""
        found = self.nvml.read_devices() if self.nvml is not None else None
        return found.devices if found is not None and found.up else []


def _holds_or_served(look: Look, devices: list[Device]) -> bool:
    """Whether the server's tree holds GPU memory now, or its launch has reached `serving`."""
    return "serving" in look.log.timeline or any(memory > 0 for _, memory in server_memory(look, devices))


COLLECTOR = Registration("deployment", CollectorSettings,
                         lambda runtime, _: DeploymentCollector(runtime.watcher, runtime.nvml),
                         "each server's place in a deployment over several nodes")
