"""Paths of the node's filesystem under `--path.rootfs`: `..` never climbs out."""

from __future__ import annotations

from pathlib import Path

from stallwatch.discovery.workload.rootfs import rootfs_path


def test_rootfs_path_clamps_dotdot(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "up").symlink_to("../../../../..")
    assert rootfs_path(str(tmp_path), "/../../a/b") == str(tmp_path / "a" / "b")
    assert rootfs_path(str(tmp_path), "/a/up/a/b") == str(tmp_path / "a" / "b")
    assert rootfs_path(str(tmp_path), "/a/b/../../..") == str(tmp_path)
    assert rootfs_path(str(tmp_path), "/a/missing") is None
    assert rootfs_path(str(tmp_path), "/a/b\x00") is None
