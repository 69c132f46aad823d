"""A deployment's membership read from a process's environment, bounded."""

from __future__ import annotations

from pathlib import Path

from stallwatch.discovery.deployment import MAX_KEY_CHARS, membership, read_environ
from stallwatch.engines import ENGINES

SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2-Instruct", "--tp", "16"]


def test_a_key_is_bounded() -> None:
    member = membership(ENGINES["sglang"], [*SGLANG, "--nnodes", "2", "--dist-init-addr", "h" * 100_000], {})
    assert member is not None and len(member.deployment) == MAX_KEY_CHARS


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
