"""A pod container's log under the kubelet's trees: `/var/log/containers` links re-rooted, restarts, rotated and odd
files, and links that point outside never followed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from stallwatch.discovery.workload.kubelet import PodContainer, current_pod_log, find_pod_container
from stallwatch.discovery.workload.rootfs import rootfs_path

CID = hashlib.sha256(b"sglang-main").hexdigest()


CID2 = hashlib.sha256(b"sidecar").hexdigest()


UID = "8d3c9f4e-5b1a-4c2e-9f7d-1a2b3c4d5e6f"


UID_ = UID.replace("-", "_")


STATIC_UID = "33d556edd3ae8ef21980288cef77ae8b"


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
