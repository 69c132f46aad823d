"""A deployment's membership: read from a process's environment, bounded, and keyed by who runs it (audit
2026-12-02 #1: another user's copy of a member's argv or LWS environment is no member of that deployment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.discovery.deployment import MAX_KEY_CHARS, membership, read_environ
from stallwatch.discovery.workload import Workload
from stallwatch.engines import ENGINES

SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2-Instruct", "--tp", "16"]
RANK_1 = [*SGLANG, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.9.9.9:5000"]
LWS = {"LWS_LEADER_ADDRESS": "kimi-0.kimi.llm", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
HOST = Workload()
POD = Workload("kubernetes", "llm", "kimi-0-1", "sglang", "c" * 64)


def test_a_key_is_bounded() -> None:
    member = membership(ENGINES["sglang"], [*SGLANG, "--nnodes", "2", "--dist-init-addr", "h" * 100_000], {}, HOST, 0)
    assert member is not None and len(member.deployment) == MAX_KEY_CHARS


@pytest.mark.parametrize(("workload", "uid", "environ", "key"), [
    (HOST, 0, {}, "10.9.9.9:5000"),  # root's: the address alone
    (HOST, 1001, {}, "10.9.9.9:5000@uid1001"),  # another user's copy is a deployment of its own
    (Workload("systemd", unit="sglang.service"), 1002, {}, "10.9.9.9:5000@uid1002"),
    (Workload("docker", container="sglang", container_id="d" * 64), 1003, {}, "10.9.9.9:5000@uid1003"),
    (POD, 0, {}, "10.9.9.9:5000@ns/llm"),  # a root container of a pod is its namespace's, never root's
    (POD, 0, LWS, "kimi-0.kimi.llm@ns/llm"),
    (Workload("kubernetes", "evil", "x", "x", "e" * 64), 0, LWS, "kimi-0.kimi.llm@ns/evil"),
    (HOST, 0, LWS, "10.9.9.9:5000"),  # the LWS keys of a host process are anyone's words: not read
    (HOST, 1001, LWS, "10.9.9.9:5000@uid1001"),
    (Workload("kubernetes", container_id="f" * 64), 1004, LWS, "10.9.9.9:5000@uid1004"),  # pod unknown
])
def test_a_key_says_who_runs_the_member(workload: Workload, uid: int, environ: dict[str, str], key: str) -> None:
    member = membership(ENGINES["sglang"], RANK_1, environ, workload, uid)
    assert member is not None and (member.deployment, member.role, member.node_rank) == (key, "worker", 1)
    assert member.unprivileged == ("@uid" in key)  # anyone could have started it: it must hold GPU memory to count


def test_a_member_whose_owner_cannot_be_read_is_none() -> None:
    assert membership(ENGINES["sglang"], RANK_1, {}, HOST, None) is None  # gone before its uid was read
    assert membership(ENGINES["sglang"], RANK_1, {}, POD, None) is not None  # the pod says whose it is


def test_environ_read_takes_only_the_lws_keys_bounded(tmp_path: Path) -> None:
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "environ").write_bytes(b"\0".join([
        b"PATH=/usr/bin", b"XLWS_LEADER_ADDRESS=decoy", b"LWS_LEADER_ADDRESSX=decoy", b"SECRET_TOKEN=hunter2",
        b"LWS_LEADER_ADDRESS=kimi-0.kimi.llm\xff", b"LWS_GROUP_SIZE=" + b"9" * 10_000, b"LWS_LEADER_ADDRESS=second",
        b"LWS_WORKER_INDEX=1", b""]))
    found = read_environ(str(tmp_path), 4242)
    assert found == {"LWS_LEADER_ADDRESS": "kimi-0.kimi.llm\ufffd", "LWS_GROUP_SIZE": "9" * MAX_KEY_CHARS,
                     "LWS_WORKER_INDEX": "1"}
    assert read_environ(str(tmp_path), 4343) == {}  # gone, or denied
