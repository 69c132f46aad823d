"""Issue 21, hostile neighbours round two: what discovery takes from other users' processes (their cgroups, network
namespaces, numbers, names, argv and the text they print). Each test reproduces one defect of
`../shared/research/audit-2026-12-01.md` (numbered as there) and fails without its fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stallwatch.config.reader import ConfigError
from support import transcripts as t
from support.configs import parse
from support.harness import Engine

FAST = ("discovery: {enabled: true, interval: 0.2s, forget_after: 30s}\n"
        "defaults: {probe: {interval: 0.2s, timeout: 1s}}\nlogs: {poll_interval: 0.1s}\n")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


# --- 11. a configured server's name is never a discovered process's; a gone one only its relaunch's -------------


def test_a_discovered_process_never_becomes_a_configured_server(exporter, engine, tmp_path: Path) -> None:
    """The configured server (no name: `sglang-30000`) is down; a process with the default port in its argv is
    discovered beside it, as `sglang-30000-2`: the configured server stays down, so InferenceServerDown fires."""
    token = f"real-{os.getpid()}-{tmp_path.name}"
    e = exporter(config=FAST + "servers:\n  - engine: sglang\n"
                 f"    match: {{cmdline: 'sglang\\.launch_server .*{token}'}}\n")
    real = engine("sglang", t.sglang_until_shards(tp=1), final="stall", tp=1, args=("--served-model-name", token))
    e.wait_for(lambda s: s.value("stallwatch_server_up", server="sglang-30000") == 1, what="the configured server")
    real.stop()
    e.wait_for(lambda s: s.value("stallwatch_server_up", server="sglang-30000") == 0, what="it to go down")
    squatter = engine("sglang", t.sglang_until_shards(tp=1), final="stall", tp=1, port=30000)
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server="sglang-30000-2") == 1 and s, timeout=15,
                        what="the other process, under a name of its own")
    assert scrape.value("stallwatch_server_up", server="sglang-30000") == 0
    assert squatter.proc.poll() is None


def test_a_gone_servers_name_is_not_taken_by_another_users_process(exporter, engine, shared_dir: Path) -> None:
    """A discovered host server is gone (a crash before its restart); another user's process with the same port in
    its argv comes first: it is `<name>-2`, and the real server, relaunched by its own user, gets its name back."""
    e = exporter(config=FAST)
    first = engine("llamacpp", t.llamacpp_healthy(), final="stall", tp=1)
    name = first.name
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, what="the server")
    first.stop()
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 0, what="it to go down")
    other = Engine(shared_dir, "llamacpp", t.llamacpp_healthy(), final="stall", tp=1, port=first.port, prefix=NOBODY)
    try:
        scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=f"{name}-2") == 1 and s, timeout=15,
                            what="the other user's process, under a name of its own")
        assert scrape.value("stallwatch_server_up", server=name) == 0
        engine("llamacpp", t.llamacpp_healthy(), final="stall", tp=1, port=first.port, log_name="relaunch.log")
        e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, timeout=15,
                   what="the relaunch under its own name")
    finally:
        other.stop()


# --- 16. intervals have floors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "key", "floor"), [
    ("web: {history_interval: 10ms}\n", "web.history_interval", "0.5s"),
    ("discovery: {interval: 0.001s}\n", "discovery.interval", "0.1s"),
    ("defaults: {probe: {interval: 1ms}}\n", "defaults.probe.interval", "0.1s"),
    ("servers:\n  - {engine: sglang, probes: [{url: 'http://127.0.0.1:1/health', interval: 50ms}]}\n",
     "servers[0].probes[0].interval", "0.1s"),
    ("logs: {poll_interval: 20ms}\n", "logs.poll_interval", "0.1s"),
    ("engine_metrics: {interval: 10ms}\n", "engine_metrics.interval", "0.1s"),
    ("gpu: {sample_interval: 1ms}\n", "gpu.sample_interval", "0.1s"),
])
def test_intervals_below_their_floor_are_refused(text: str, key: str, floor: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(text, file="c.yml")
    message = str(refused.value)
    assert message.startswith("c.yml:") and f": {key}" in message
    assert f"expected a duration of at least {floor}" in message, message
