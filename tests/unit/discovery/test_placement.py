"""Where a process lives: its cgroup parsed, its pod's or container's log found under the kubelet's and Docker's
trees, and hostile trees (links out, FIFOs, huge files) never followed or read whole."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import threading
from pathlib import Path

import pytest

from stallwatch.discovery.workload.cgroup import Placement, parse_cgroup, read_placement, short_id
from stallwatch.discovery.workload.docker import DockerContainer, read_docker
from stallwatch.discovery.workload.kubelet import PodContainer, current_pod_log, find_pod_container
from stallwatch.discovery.workload.rootfs import rootfs_path

CID = hashlib.sha256(b"sglang-main").hexdigest()


CID2 = hashlib.sha256(b"sidecar").hexdigest()


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


def make_pod_log(
    host: Path, ns: str, pod: str, uid: str, ctr: str, restarts: tuple[int, ...] = (0,), pod_logs: str = "var/log/pods"
) -> str:
    """Create `<pod_logs>/<ns>_<pod>_<uid>/<ctr>/<N>.log` files under host; return the node log dir."""
    log_dir = host / pod_logs / f"{ns}_{pod}_{uid}" / ctr
    log_dir.mkdir(parents=True, exist_ok=True)
    for n in restarts:
        (log_dir / f"{n}.log").write_text("2026-11-29T10:15:00.000000000Z stdout F hello\n")
    return "/" + str(log_dir.relative_to(host))


def make_link(
    host: Path, pod: str, ns: str, ctr: str, cid: str, target: str, container_logs: str = "var/log/containers"
) -> Path:
    """Create the kubelet's legacy link, truncated to 251 characters + `.log` as legacy.go does."""
    links = host / container_logs
    links.mkdir(parents=True, exist_ok=True)
    link = links / (f"{pod}_{ns}_{ctr}-{cid}"[:251] + ".log")
    link.symlink_to(target)
    return link


def find(host: Path, cid: str = CID, uid: str = UID, **kwargs: str) -> PodContainer | None:
    pod_logs = kwargs.get("pod_logs", "/var/log/pods")
    container_logs = kwargs.get("container_logs", "/var/log/containers")
    return find_pod_container(str(host), pod_logs, container_logs, cid, uid)


def set_mtimes(host: Path, log_dirs: dict[str, float]) -> None:
    for node_dir, mtime in log_dirs.items():
        os.utime(host / node_dir.lstrip("/"), (mtime, mtime))


def make_docker(
    host: Path,
    config: object | None = None,
    hostconfig: object | None = None,
    cid: str = CID,
    root: str = "var/lib/docker",
) -> Path:
    """A container state dir; dicts are written as JSON, str/bytes verbatim, None leaves the file out."""
    d = host / root / "containers" / cid
    d.mkdir(parents=True)
    for name, content in (("config.v2.json", config), ("hostconfig.json", hostconfig)):
        if isinstance(content, bytes):
            (d / name).write_bytes(content)
        elif content is not None:
            (d / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return d


CONFIG = {
    "ID": CID,
    "Name": "/sglang-eagle3",
    "NetworkSettings": {
        "Networks": {
            "bridge": {"IPAddress": "172.17.0.5", "GlobalIPv6Address": "fd00::5"},
            "llm-net": {"IPAddress": "10.89.0.7", "GlobalIPv6Address": ""},
            "dup": {"IPAddress": "172.17.0.5"},
            "weird": {"IPAddress": "not-an-ip", "GlobalIPv6Address": 7},
            "broken": "nope",
        }
    },
}


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


def test_link_is_rerooted(tmp_path: Path) -> None:
    host = tmp_path / "host"
    log_dir = make_pod_log(host, "llm", "kimi-0", UID, "sglang")
    make_link(host, "kimi-0", "llm", "sglang", CID, f"{log_dir}/0.log")  # absolute node path
    assert find(host) == PodContainer("llm", "kimi-0", UID, "sglang", 0, f"{log_dir}/0.log", log_dir)
    assert log_dir == f"/var/log/pods/llm_kimi-0_{UID}/sglang"
    # Without a pod UID (cgroup lacked it) the link alone is enough.
    assert find(host, uid="") == PodContainer("llm", "kimi-0", UID, "sglang", 0, f"{log_dir}/0.log", log_dir)


def test_relative_link_and_rerooted_pod_logs_dir(tmp_path: Path) -> None:
    host = tmp_path / "host"
    log_dir = make_pod_log(host, "llm", "kimi-0", UID, "sglang", pod_logs="data/pods")
    (host / "var/log").mkdir(parents=True)
    (host / "var/log/pods").symlink_to("/data/pods")  # absolute on the node: must resolve under host
    make_link(host, "kimi-0", "llm", "sglang", CID, f"../pods/llm_kimi-0_{UID}/sglang/0.log")
    found = find(host)
    assert found is not None
    assert (found.log_path, found.log_dir) == (
        f"/var/log/pods/llm_kimi-0_{UID}/sglang/0.log",
        f"/var/log/pods/llm_kimi-0_{UID}/sglang",
    )
    assert current_pod_log(str(host), found.log_dir) == (found.log_path, 0)
    assert log_dir == f"/data/pods/llm_kimi-0_{UID}/sglang"


def test_custom_log_roots(tmp_path: Path) -> None:
    host = tmp_path / "host"
    log_dir = make_pod_log(host, "llm", "kimi-0", UID, "sglang", pod_logs="srv/pods")
    make_link(host, "kimi-0", "llm", "sglang", CID, f"{log_dir}/0.log", container_logs="srv/containers")
    assert find(host) is None  # default roots are empty here
    found = find(host, pod_logs="/srv/pods", container_logs="/srv/containers/")
    assert found is not None and found.container == "sglang" and found.log_dir == log_dir


def test_truncated_link_falls_back_to_pod_dir(tmp_path: Path) -> None:
    host = tmp_path / "host"
    pod = "kimi-k2-eagle3-" + "x" * 165  # the pod dir name stays within 255 characters, the link name does not
    log_dir = make_pod_log(host, "llm", pod, UID, "sglang")
    link = make_link(host, pod, "llm", "sglang", CID, f"{log_dir}/0.log")
    assert len(link.name) == 255 and CID not in link.name
    assert find(host) == PodContainer("llm", pod, UID, "sglang", 0, f"{log_dir}/0.log", log_dir)
    assert find(host, uid="") is None  # nothing left to go on


def test_two_containers_with_links(tmp_path: Path) -> None:
    host = tmp_path / "host"
    main_dir = make_pod_log(host, "llm", "kimi-0", UID, "sglang")
    side_dir = make_pod_log(host, "llm", "kimi-0", UID, "metrics-sidecar", restarts=(0, 1, 2))
    make_link(host, "kimi-0", "llm", "sglang", CID, f"{main_dir}/0.log")
    make_link(host, "kimi-0", "llm", "metrics-sidecar", CID2, f"{side_dir}/2.log")
    assert find(host, cid=CID).container == "sglang"  # type: ignore[union-attr]
    side = find(host, cid=CID2)
    assert side is not None and (side.container, side.restart) == ("metrics-sidecar", 2)


def test_two_containers_truncated_links_pick_by_name_prefix(tmp_path: Path) -> None:
    host = tmp_path / "host"
    pod = "p" * 180  # the 251-character cut lands inside the container ID
    main_dir = make_pod_log(host, "llm", pod, UID, "sglang")
    side_dir = make_pod_log(host, "llm", pod, UID, "sidecar")
    make_link(host, pod, "llm", "sglang", CID, f"{main_dir}/0.log")
    make_link(host, pod, "llm", "sidecar", CID2, f"{side_dir}/0.log")
    set_mtimes(host, {main_dir: 1_000_000, side_dir: 2_000_000})  # the wrong one is newer
    assert find(host, cid=CID).container == "sglang"  # type: ignore[union-attr]
    assert find(host, cid=CID2).container == "sidecar"  # type: ignore[union-attr]


def test_two_containers_without_usable_links_pick_newest(tmp_path: Path) -> None:
    host = tmp_path / "host"
    pod = "q" * 180
    # The 251-character cut keeps none of the container ID: the links prove nothing, so mtime decides.
    main, side = "c" * 60 + "-main", "c" * 60 + "-side"
    main_dir = make_pod_log(host, "llm", pod, UID, main)
    side_dir = make_pod_log(host, "llm", pod, UID, side)
    main_link = make_link(host, pod, "llm", main, CID, f"{main_dir}/0.log")
    make_link(host, pod, "llm", side, CID2, f"{side_dir}/0.log")
    set_mtimes(host, {main_dir: 2_000_000, side_dir: 1_000_000})
    assert find(host).container == main  # type: ignore[union-attr]
    set_mtimes(host, {main_dir: 1_000_000, side_dir: 2_000_000})
    assert find(host).container == side  # type: ignore[union-attr]
    # Only the other container's ID-less link is left: it must not be taken for ours.
    main_link.unlink()
    set_mtimes(host, {main_dir: 2_000_000, side_dir: 1_000_000})
    assert find(host).container == main  # type: ignore[union-attr]


def test_no_links_at_all(tmp_path: Path) -> None:
    host = tmp_path / "host"
    a = make_pod_log(host, "llm", "kimi-0", UID, "a-first")
    b = make_pod_log(host, "llm", "kimi-0", UID, "b-second")
    make_pod_log(host, "other", "kimi-0", "11111111-2222-3333-4444-555555555555", "zzz")
    set_mtimes(host, {a: 1_000_000, b: 2_000_000})
    assert find(host).container == "b-second"  # type: ignore[union-attr]
    set_mtimes(host, {a: 3_000_000})
    assert find(host).container == "a-first"  # type: ignore[union-attr]


def test_restart_moves_to_next_log(tmp_path: Path) -> None:
    host = tmp_path / "host"
    log_dir = make_pod_log(host, "llm", "kimi-0", UID, "sglang")
    assert current_pod_log(str(host), log_dir) == (f"{log_dir}/0.log", 0)
    assert find(host, cid="").restart == 0  # type: ignore[union-attr]
    (host / log_dir.lstrip("/") / "1.log").write_text("")
    assert current_pod_log(str(host), log_dir) == (f"{log_dir}/1.log", 1)
    assert current_pod_log(str(host), log_dir + "/") == (f"{log_dir}/1.log", 1)
    found = find(host, cid="")
    assert found is not None and (found.restart, found.log_path) == (1, f"{log_dir}/1.log")


def test_rotated_and_odd_files_ignored(tmp_path: Path) -> None:
    host = tmp_path / "host"
    log_dir = make_pod_log(host, "llm", "kimi-0", UID, "sglang", restarts=(9, 10))
    d = host / log_dir.lstrip("/")
    for name in (
        "10.log.20261129-101500",
        "10.log.20261129-100000.gz",
        "12.log.20261129-101500",
        "13.log.20261129-100000.gz",
        "14.log.tmp",
        "x.log",
        "-1.log",
        "\u0661\u0665.log",  # Arabic-Indic digits are not [0-9],
    ):
        (d / name).write_text("")
    (d / "20.log").mkdir()  # not a regular file
    (d / "21.log").symlink_to("/etc/passwd")  # re-rooted: host/etc/passwd does not exist
    assert current_pod_log(str(host), log_dir) == (f"{log_dir}/10.log", 10)
    assert current_pod_log(str(host), "/var/log/pods/missing") is None


def test_links_pointing_outside_are_ignored(tmp_path: Path) -> None:
    host = tmp_path / "host"
    outside = tmp_path / "outside"
    make_pod_log(outside, "llm", "evil", UID, "sglang")  # a real tree, reachable only by escaping host
    (host / "etc").mkdir(parents=True)
    (host / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    make_link(host, "a", "llm", "x", CID, "/etc/passwd")
    (host / "var/log/containers" / f"b_llm_y-{CID}.log").symlink_to("../../../../../../../../../etc/shadow")
    (host / "var/log/containers" / f"c_llm_z-{CID}.log").symlink_to(
        outside / f"var/log/pods/llm_evil_{UID}/sglang/0.log"
    )
    (host / "var/log/containers" / f"d_llm_w-{CID}.log").write_text("a regular file, not a link")
    (host / "var/log/pods").mkdir(parents=True)
    assert find(host) is None


def test_pod_logs_link_outside_is_not_followed(tmp_path: Path) -> None:
    host = tmp_path / "host"
    outside = tmp_path / "outside"
    log_dir = make_pod_log(outside, "llm", "kimi-0", UID, "sglang")
    (host / "var/log").mkdir(parents=True)
    (host / "var/log/pods").symlink_to(outside / "var/log/pods")  # absolute path valid only outside host
    make_link(host, "kimi-0", "llm", "sglang", CID, f"{log_dir}/0.log")
    assert find(host) is None
    assert rootfs_path(str(host), "/var/log/pods") is None


def test_link_uid_mismatch_uses_pod_dir(tmp_path: Path) -> None:
    host = tmp_path / "host"
    other_uid = "11111111-2222-3333-4444-555555555555"
    stale = make_pod_log(host, "llm", "kimi-0", other_uid, "sglang")
    fresh = make_pod_log(host, "llm", "kimi-0", UID, "sglang", restarts=(0, 1))
    make_link(host, "kimi-0", "llm", "sglang", CID, f"{stale}/0.log")
    found = find(host)
    assert found is not None and (found.pod_uid, found.log_dir, found.restart) == (UID, fresh, 1)


def test_static_pod_uid_and_underscored_uid(tmp_path: Path) -> None:
    host = tmp_path / "host"
    log_dir = make_pod_log(host, "kube-system", "sglang-node1", STATIC_UID, "server")
    assert find(host, cid="", uid=STATIC_UID).log_dir == log_dir  # type: ignore[union-attr]
    log_dir2 = make_pod_log(host, "llm", "kimi-0", UID, "sglang")
    assert find(host, cid="", uid=UID_).log_dir == log_dir2  # type: ignore[union-attr]


def test_odd_trees_do_not_raise(tmp_path: Path) -> None:
    host = tmp_path / "host"
    pods = host / "var/log/pods"
    pods.mkdir(parents=True)
    for name in ("a_b", f"a_b_c_{UID}", f"_x_{UID}", f"ns__{UID}"):
        (pods / name).mkdir()
    (pods / f"llm_file_{UID}").write_text("")
    (pods / f"llm_empty_{UID}").mkdir()
    (pods / f"llm_nolog_{UID}" / "sglang").mkdir(parents=True)
    (host / "var/log/containers").mkdir(parents=True)
    (host / "var/log/containers" / f"loop-{CID}.log").symlink_to(f"loop-{CID}.log")
    assert find(host) is None
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "var").symlink_to("/var")  # host/var -> host/var: a loop, not a hang
    assert find_pod_container(str(loop), "/var/log/pods", "/var/log/containers", CID, UID) is None
    assert rootfs_path(str(loop), "/var/log") is None
    assert find(host, cid="", uid="") is None


def test_rootfs_path_clamps_dotdot(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "up").symlink_to("../../../../..")
    assert rootfs_path(str(tmp_path), "/../../a/b") == str(tmp_path / "a" / "b")
    assert rootfs_path(str(tmp_path), "/a/up/a/b") == str(tmp_path / "a" / "b")
    assert rootfs_path(str(tmp_path), "/a/b/../../..") == str(tmp_path)
    assert rootfs_path(str(tmp_path), "/a/missing") is None
    assert rootfs_path(str(tmp_path), "/a/b\x00") is None


def test_docker_full(tmp_path: Path) -> None:
    host = tmp_path / "host"
    make_docker(host, CONFIG, {"LogConfig": {"Type": "json-file", "Config": {"max-size": "10m"}}})
    assert read_docker(str(host), "/var/lib/docker", CID) == DockerContainer(
        id=CID,
        name="sglang-eagle3",
        log_driver="json-file",
        log_path=f"/var/lib/docker/containers/{CID}/{CID}-json.log",
        addresses=("172.17.0.5", "fd00::5", "10.89.0.7"),
    )


@pytest.mark.parametrize(
    ("hostconfig", "driver"),
    [
        (None, "json-file"),  # absent file: Docker's default driver
        ({"LogConfig": {"Type": "local", "Config": {}}}, "local"),
        ({"LogConfig": {"Type": "journald"}}, "journald"),
        ({"NetworkMode": "host"}, "json-file"),
        ({"LogConfig": {"Type": ""}}, "json-file"),
        ({"LogConfig": {"Type": 5}}, "unknown"),
        ({"LogConfig": "json-file"}, "unknown"),
        ("{not json", "unknown"),
        ("[1, 2]", "unknown"),
        ("", "unknown"),
        ("[" * 200_000, "unknown"),  # RecursionError inside json
        (b"\xff\xfe\x00garbage", "unknown"),
    ],
)
def test_docker_log_driver(tmp_path: Path, hostconfig: object, driver: str) -> None:
    host = tmp_path / "host"
    make_docker(host, CONFIG, hostconfig)
    found = read_docker(str(host), "/var/lib/docker", CID)
    assert found is not None and found.log_driver == driver and found.name == "sglang-eagle3"


def test_docker_bad_config(tmp_path: Path) -> None:
    host = tmp_path / "host"
    make_docker(host, '{"Name": "/x", "NetworkSettings":', {"LogConfig": {"Type": "local"}})
    assert read_docker(str(host), "/var/lib/docker", CID) == DockerContainer(
        CID, "", "local", f"/var/lib/docker/containers/{CID}/{CID}-json.log", ()
    )
    other = tmp_path / "other"
    make_docker(other, {"Name": 5, "NetworkSettings": {"Networks": []}})
    found = read_docker(str(other), "/var/lib/docker", CID)
    assert found is not None and (found.name, found.addresses, found.log_driver) == ("", (), "json-file")


def test_docker_oversized_file_is_not_read(tmp_path: Path) -> None:
    host = tmp_path / "host"
    make_docker(host, CONFIG, '{"LogConfig": {"Type": "local"}}' + " " * (4 * 1024 * 1024))
    assert read_docker(str(host), "/var/lib/docker", CID).log_driver == "unknown"  # type: ignore[union-attr]


def test_docker_fifo_does_not_block(tmp_path: Path) -> None:
    host = tmp_path / "host"
    d = make_docker(host, CONFIG)
    os.mkfifo(d / "hostconfig.json")
    result: list[DockerContainer | None] = []
    worker = threading.Thread(target=lambda: result.append(read_docker(str(host), "/var/lib/docker", CID)), daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "read_docker blocked on a FIFO"
    assert result[0] is not None and result[0].log_driver == "unknown"


def test_docker_absent_or_bad_id(tmp_path: Path) -> None:
    host = tmp_path / "host"
    make_docker(host, CONFIG)
    assert read_docker(str(host), "/var/lib/docker", CID2) is None
    assert read_docker(str(host), "/srv/docker", CID) is None
    for bad in ("", "../../../etc", CID.upper(), CID[:12], CID + "0"):
        assert read_docker(str(host), "/var/lib/docker", bad) is None


def test_docker_links_rerooted(tmp_path: Path) -> None:
    host = tmp_path / "host"
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"Name": "/escaped", "LogConfig": {"Type": "local"}}))
    d = make_docker(host, root="data/docker")
    (host / "var/lib").mkdir(parents=True)
    (host / "var/lib/docker").symlink_to("/data/docker")  # absolute on the node
    (d / "config.v2.json").symlink_to(outside)  # exists only outside host: must not be read
    (d / "hostconfig.json").symlink_to(outside)
    found = read_docker(str(host), "/var/lib/docker", CID)
    assert found is not None
    assert (found.name, found.log_driver) == ("", "unknown")
    assert found.log_path == f"/var/lib/docker/containers/{CID}/{CID}-json.log"
    (d / "config.v2.json").unlink()
    (host / "cfg.json").write_text(json.dumps(CONFIG))
    (d / "config.v2.json").symlink_to("/cfg.json")  # inside host: followed, re-rooted
    assert read_docker(str(host), "/var/lib/docker", CID).name == "sglang-eagle3"  # type: ignore[union-attr]
