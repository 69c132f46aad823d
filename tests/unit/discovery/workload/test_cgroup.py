"""A process's cgroup parsed into its runtime, pod and container: every runtime's shape, noise and huge lines, read
bounded."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from pathlib import Path

import pytest

from stallwatch.discovery.workload.cgroup import Placement, parse_cgroup, read_placement, short_id

CID = hashlib.sha256(b"sglang-main").hexdigest()


UID = "8d3c9f4e-5b1a-4c2e-9f7d-1a2b3c4d5e6f"


UID_ = UID.replace("-", "_")


STATIC_UID = "33d556edd3ae8ef21980288cef77ae8b"


KUBE = "kubernetes"


CGROUP_CASES: list[tuple[str, str, Placement]] = [
    (
        "containerd, systemd driver, burstable",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        Placement(KUBE, CID, UID),
    ),
    (
        "containerd, systemd driver, guaranteed",
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        Placement(KUBE, CID, UID),
    ),
    (
        "static pod, 32-hex uid",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        Placement(KUBE, CID, STATIC_UID),
    ),
    ("containerd, cgroupfs, besteffort", f"0::/kubepods/besteffort/pod{UID}/{CID}\n", Placement(KUBE, CID, UID)),
    ("containerd, cgroupfs, guaranteed", f"0::/kubepods/pod{UID}/{CID}\n", Placement(KUBE, CID, UID)),
    (
        "containerd colon form (v1, bare metal)",
        f"12:memory:/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n"
        f"1:name=systemd:/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}\n",
        Placement(KUBE, CID, UID),
    ),
    (
        "CRI-O, systemd",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope\n",
        Placement(KUBE, CID, UID),
    ),
    ("CRI-O, cgroupfs", f"0::/kubepods/burstable/pod{UID}/crio-{CID}\n", Placement(KUBE, CID, UID)),
    (
        "CRI-O conmon is not the container",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-conmon-{CID}.scope\n",
        Placement(KUBE, "", UID),
    ),
    (
        "dockershim, cgroupfs, v1 only",
        f"11:devices:/kubepods/burstable/pod{UID}/{CID}\n4:memory:/kubepods/burstable/pod{UID}/{CID}\n",
        Placement(KUBE, CID, UID),
    ),
    (
        "dockershim, systemd",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n",
        Placement(KUBE, CID, UID),
    ),
    (
        "private cgroup namespace",
        f"0::/../../kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        Placement(KUBE, CID, UID),
    ),
    ("docker, systemd", f"0::/system.slice/docker-{CID}.scope\n", Placement("docker", CID)),
    ("docker, cgroupfs", f"0::/docker/{CID}\n", Placement("docker", CID)),
    ("docker, private cgroupns", f"0::/../../system.slice/docker-{CID}.scope\n", Placement("docker", CID)),
    ("docker, sub-cgroup", f"0::/system.slice/docker-{CID}.scope/init.scope\n", Placement("docker", CID)),
    (
        "docker, v1 only",
        "".join(
            f"{n}:{c}:/docker/{CID}\n"
            for n, c in [(12, "pids"), (9, "cpu,cpuacct"), (4, "memory"), (3, "devices"), (1, "name=systemd")]
        ),
        Placement("docker", CID),
    ),
    (
        "hybrid: v1 names the container",
        f"5:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n0::/\n",
        Placement("docker", CID),
    ),
    (
        "hybrid: unified shows the runtime's service",
        f"0::/system.slice/containerd.service\n5:memory:/docker/{CID}\n",
        Placement("docker", CID),
    ),
    ("unknown runtime keeps the id", f"0::/default/{CID}\n", Placement("host", CID)),
    ("systemd service", "0::/system.slice/sglang.service\n", Placement("systemd", unit="sglang.service")),
    (
        "systemd service, nested",
        "0::/system.slice/sglang.service/worker\n",
        Placement("systemd", unit="sglang.service"),
    ),
    (
        "systemd template unit",
        "0::/system.slice/system-vllm.slice/vllm@0.service\n",
        Placement("systemd", unit="vllm@0.service"),
    ),
    ("systemd, custom slice", "0::/gpu.slice/tgi.service\n", Placement("systemd", unit="tgi.service")),
    ("podman.service is no pod", "0::/system.slice/podman.service\n", Placement("systemd", unit="podman.service")),
    (
        "v1 prefers name=systemd over cpu",
        "7:cpu,cpuacct:/system.slice/other.service\n1:name=systemd:/system.slice/sglang.service\n",
        Placement("systemd", unit="sglang.service"),
    ),
    ("user session", "0::/user.slice/user-1000.slice/session-3.scope\n", Placement("host")),
    (
        "user unit",
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/sglang.service\n",
        Placement("host"),
    ),
    ("root", "0::/\n", Placement("host")),
    ("only ..", "0::/../..\n", Placement("host")),
    ("v1 root", "12:pids:/\n1:name=systemd:/\n0::/\n", Placement("host")),
    ("mount leaf", f"0::/system.slice/docker-{CID}.mount\n", Placement("host")),
    (
        "realistic mount leaf",
        f"0::/system.slice/var-lib-docker-overlay2-{CID}-merged.mount\n",
        Placement("host"),
    ),
    ("pod followed by 64 hex is no uid", f"0::/foo/pod{CID}\n", Placement("host")),
    ("uppercase id", f"0::/docker/{CID.upper()}\n", Placement("host")),
    ("empty", "", Placement("host")),
    ("garbage", "hello\n::\n0:\n:::::\n\x00\x01\n", Placement("host")),
    ("replacement characters", "0::/system.slice/\ufffd\ufffd.service\n", Placement("host")),
    (
        "odd unit characters refused",
        "0::/system.slice/a b;rm.service\n",
        Placement("host"),
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CGROUP_CASES], ids=[c[0] for c in CGROUP_CASES])
def test_parse_cgroup(text: str, expected: Placement) -> None:
    assert parse_cgroup(text) == expected


def test_parse_cgroup_never_raises_on_noise() -> None:
    rng = random.Random(1234)
    tokens = [
        "0",
        "1",
        ":",
        "::",
        "/",
        "..",
        "kubepods",
        "pod",
        UID_,
        CID,
        "docker-",
        ".scope",
        ".slice",
        "crio-",
        "cri-containerd",
        ".service",
        ".mount",
        "\n",
        "\x00",
        "\ufffd",
        "name=systemd",
        "_",
        "-",
        " ",
    ]
    for _ in range(3000):
        text = "".join(rng.choice(tokens) for _ in range(rng.randrange(0, 40)))
        result = parse_cgroup(text)
        assert result.runtime in ("kubernetes", "docker", "systemd", "host")
        assert result.container_id == "" or len(result.container_id) == 64


def test_parse_cgroup_huge_line() -> None:
    assert parse_cgroup("0::/" + "a/" * 200_000 + f"docker/{CID}") == Placement("docker", CID)


def test_read_placement(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_bytes(
        b"0::/system.slice/\xff\xfe.service\n" + f"5:memory:/docker/{CID}\n".encode()
    )
    assert read_placement(str(tmp_path), 42) == Placement("docker", CID)
    assert read_placement(str(tmp_path), 43) is None  # vanished
    (tmp_path / "44" / "cgroup").mkdir(parents=True)
    assert read_placement(str(tmp_path), 44) is None


def test_read_placement_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    filler = b"9:blkio:/\n" * 8000  # 80 KB, beyond the 64 KiB cap
    (tmp_path / "7" / "cgroup").write_bytes(filler + f"0::/docker/{CID}\n".encode())
    assert read_placement(str(tmp_path), 7) == Placement("host")


def test_read_placement_real_proc() -> None:
    if not os.path.exists("/proc/self/cgroup"):
        pytest.skip("no /proc/self/cgroup on this system")
    assert isinstance(read_placement("/proc", os.getpid()), Placement)


def test_short_id_and_frozen() -> None:
    assert short_id(CID) == CID[:12]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Placement("host").runtime = "docker"  # type: ignore[misc]
