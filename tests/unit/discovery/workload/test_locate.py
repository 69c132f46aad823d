"""A process's workload (pod, container, unit or host) and the log sources that follow from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stallwatch.config import Paths
from stallwatch.discovery import namespaces
from stallwatch.discovery.workload import Workload, locate
from stallwatch.discovery.workload.log_sources import log_sources
from stallwatch.logs.source import LogSource

CID = "0f5e9a2b" * 8


UID = "3a4b5c6d-1111-4222-8333-944455556666"


U_ = UID.replace("-", "_")


def tree(tmp_path: Path, cgroup: str, stdout: str = "pipe:[4242]") -> Paths:
    """A process 4242 with `cgroup` and stdout, a kubelet log tree and a Docker directory under a rootfs."""
    proc = tmp_path / "proc" / "4242"
    (proc / "fd").mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    os.symlink(stdout, proc / "fd" / "1")
    root = tmp_path / "root"
    pod_dir = root / f"var/log/pods/llm_kimi-0_{UID}/sglang"
    pod_dir.mkdir(parents=True)
    (pod_dir / "0.log").write_text("")
    (root / "var/log/containers").mkdir(parents=True)
    os.symlink(f"/var/log/pods/llm_kimi-0_{UID}/sglang/0.log",
               root / f"var/log/containers/kimi-0_llm_sglang-{CID}.log")
    docker = root / "var/lib/docker/containers" / CID
    docker.mkdir(parents=True)
    (docker / "config.v2.json").write_text(json.dumps({"ID": CID, "Name": "/vllm-0"}))
    (docker / "hostconfig.json").write_text(json.dumps({"LogConfig": {"Type": "json-file"}}))
    return Paths(procfs=str(tmp_path / "proc"), rootfs=str(root))


@pytest.fixture(autouse=True)
def in_a_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixture trees have no namespaces: their process is taken to be where a runtime put it (that check, with
    real namespaces, is tests/root/test_discovery.py's)."""
    monkeypatch.setattr(namespaces, "in_container", lambda procfs, pid: True)


POD = Workload("kubernetes", "llm", "kimi-0", "sglang", CID, pod_log=f"/var/log/pods/llm_kimi-0_{UID}/sglang/0.log")


@pytest.mark.parametrize(("cgroup", "expected"), [
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-{CID}.scope\n",
     POD),
    (f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n", POD),
    (f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n",
     POD),
    (f"0::/system.slice/containerd.service/kubepods-besteffort-pod{U_}.slice:cri-containerd:{CID}\n", POD),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/crio-{CID}.scope\n", POD),
    (f"0::/../../kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n", POD),  # private cgroupns
    (f"0::/system.slice/docker-{CID}.scope\n", "docker"),
    (f"5:memory:/docker/{CID}\n0::/system.slice/containerd.service\n", "docker"),
    ("0::/system.slice/kimi.service\n", Workload("systemd", unit="kimi.service")),
    ("0::/user.slice/user-1000.slice/session-3.scope\n", Workload()),
    # A user's delegated subtree named like a pod's container (docs/research/audit-2026-12-01.md #1): no runtime
    # puts one there.
    (f"0::/user.slice/user-1001.slice/user@1001.service/app.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n",
     Workload()),
    (f"0::/user.slice/user-1001.slice/user@1001.service/app.slice/docker-{CID}.scope\n", Workload()),
    ("0::/\n", Workload()),
    ("garbage\xff\n", Workload()),
])
def test_locate_every_cgroup_shape(tmp_path: Path, cgroup: str, expected: Workload | str) -> None:
    found = locate(tree(tmp_path, cgroup), 4242)
    if expected == "docker":
        assert (found.runtime, found.name, found.container, found.container_id) == ("docker", "vllm-0", "vllm-0", CID)
    else:
        assert found == expected


def test_log_sources_follow_the_workload(tmp_path: Path) -> None:
    paths = tree(tmp_path, f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n")
    pod = locate(paths, 4242)
    (source,) = log_sources(paths, 4242, pod)
    assert source == LogSource(pod.pod_log, f"{paths.rootfs}{pod.pod_log}", "cri", via="node", name="container")

    docker_paths = tree(tmp_path / "d", f"0::/docker/{CID}\n")
    (source,) = log_sources(docker_paths, 4242, locate(docker_paths, 4242))
    assert source.format == "docker" and source.path.endswith(f"{CID}-json.log") and source.name == "container"

    unit = Workload("systemd", unit="kimi.service")
    unit_paths = tree(tmp_path / "u", "0::/system.slice/kimi.service\n", stdout="socket:[77]")
    assert log_sources(unit_paths, 4242, unit) == (
        LogSource("journal:kimi.service", format="journal", journal_match="_SYSTEMD_UNIT=kimi.service",
                  name="journal"),)
    assert log_sources(tree(tmp_path / "h", "0::/\n"), 4242, Workload()) == ()  # stdout on a pipe: no log


def test_a_regular_stdout_file_wins_and_is_read_through_its_fd_link(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("hello\n")
    paths = tree(tmp_path, f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n",
                 stdout=str(log))
    (source,) = log_sources(paths, 4242, locate(paths, 4242))
    assert source == LogSource(str(log), f"{paths.procfs}/4242/fd/1", "plain", via="fd", name="stdout")


def test_a_pod_log_link_out_of_the_rootfs_is_not_followed(tmp_path: Path) -> None:
    paths = tree(tmp_path, f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n")
    log = Path(paths.rootfs) / f"var/log/pods/llm_kimi-0_{UID}/sglang/0.log"
    log.unlink()
    os.symlink("/etc/shadow", log)
    (source,) = log_sources(paths, 4242, locate(paths, 4242))
    assert source.open_path == "" and "not found under --path.rootfs" in source.unavailable


def test_labels_that_are_not_utf8_are_escaped_never_fatal() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from stallwatch.collectors import StallwatchCollector

    class Hostile:
        def collect(self) -> list[GaugeMetricFamily]:
            family = GaugeMetricFamily("stallwatch_server_info", "x", labels=["server", "pod"])
            family.add_metric(["llm/caf\udce9", "caf\udce9"], 1.0)  # b"caf\xe9" decoded with surrogateescape
            family.add_metric(["llm/ok", "ok"], 1.0)
            return [family]

    registry = CollectorRegistry()
    registry.register(StallwatchCollector({"hostile": Hostile()}))
    text = generate_latest(registry).decode()
    assert 'stallwatch_server_info{pod="caf\\\\xe9",server="llm/caf\\\\xe9"} 1.0' in text
    assert 'stallwatch_collector_success{collector="hostile"} 1.0' in text
