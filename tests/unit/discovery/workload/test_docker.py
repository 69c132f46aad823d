"""A Docker container's name and log driver from its `config.v2.json` and `hostconfig.json`: bad, oversized and FIFO
files never read whole nor block."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from stallwatch.discovery.workload.docker import DockerContainer, read_docker

CID = hashlib.sha256(b"sglang-main").hexdigest()


CID2 = hashlib.sha256(b"sidecar").hexdigest()


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
