"""Servers in pods, containers and units (real namespaces and cgroups): their logs, phases, pages and names."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stallwatch.web.routes import status_path
from support import transcripts
from support import transcripts as t
from support.harness import Scrape, free_port, poll
from support.paths import SIM_BIN, SIM_PKGS
from support.sandbox import DockerContainer, Netns, Pod, SystemdUnit


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as resources:
        yield resources


def discovery(tmp_path: Path, extra: str = "") -> str:
    return ("discovery: {enabled: true, interval: 1s}\n"
            "defaults:\n  probe: {timeout: 1s, interval: 1s}\n"
            f"logs: {{poll_interval: 0.2s}}\n{extra}")


def start(exporter, tmp_path: Path, extra: str = "", env: dict[str, str] | None = None):
    return exporter(config=discovery(tmp_path, extra), args=(f"--path.rootfs={tmp_path / 'root'}",), env=env)


def phase(s: Scrape, server: str) -> str | None:
    return next((ls["phase"] for ls in s.labelsets("stallwatch_startup_phase")
                 if ls["server"] == server and s.value("stallwatch_startup_phase", **ls) == 1), None)


def info(s: Scrape, server: str) -> dict[str, str]:
    found = [ls for ls in s.labelsets("stallwatch_server_info") if ls["server"] == server]
    assert len(found) == 1, found
    return found[0]


CONFIG = ("discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
          "engine_metrics: {interval: 0.3s, timeout: 1s}\n")


BUSY = {"running": 8, "waiting": 2, "throughput": 400.0, "ranks": 2, "interval": 0.3}


def _value(scrape: Scrape, name: str, server: str, source: str | None = None) -> float | None:
    labels = {"server": server} if source is None else {"server": server, "source": source}
    return scrape.value(f"stallwatch_{name}", **labels)


def test_two_pods_on_one_port_are_two_servers_with_their_own_logs_and_phases(exporter, tmp_path: Path,
                                                                               stack: contextlib.ExitStack) -> None:
    stalled = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=2, shards=64), namespace="llm",
                                      pod="kimi-0", container="sglang", final="stall", tp=2, port=30000))
    healthy = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_healthy(tp=2), namespace="llm", pod="qwen-0",
                                      container="sglang", final="serve", tp=2, port=30000))
    e = start(exporter, tmp_path)
    good_url = f"http://{healthy.address}:30000/health"
    scrape = e.wait_for(lambda s: phase(s, "llm/kimi-0") == "loading_weights"
                        and s.probe("stallwatch_probe_success", server="llm/qwen-0", url=good_url) == 1 and s,
                        timeout=30, what="both pods, each with its own phase")
    assert phase(scrape, "llm/qwen-0") == "serving"
    assert scrape.value("stallwatch_weight_shards_loaded", server="llm/kimi-0") == 64
    assert scrape.value("stallwatch_weight_shards_expected", server="llm/kimi-0") == 64
    # Each has its own CRI log, by the node's path; the engine's text counted without the CRI framing.
    for pod in (stalled, healthy):
        assert scrape.log("stallwatch_log_up", server=pod.name, path=pod.log_node_path) == 1
    assert info(scrape, "llm/kimi-0") == {
        "server": "llm/kimi-0", "engine": "sglang", "model": "moonshotai/Kimi-K2-Instruct", "tensor_parallel": "2",
        "runtime": "kubernetes", "namespace": "llm", "pod": "kimi-0", "container": "sglang",
        "container_id": stalled.container_id, "unit": ""}
    # The stalled one never opened its port; the healthy one is probed at its pod IP and listens.
    assert scrape.value("stallwatch_server_listening", server="llm/kimi-0", port="30000") == 0
    assert scrape.value("stallwatch_server_listening", server="llm/qwen-0", port="30000") == 1
    refused = f"http://{stalled.address}:30000/health"
    assert scrape.probe("stallwatch_probe_success", server="llm/kimi-0", url=refused) == 0
    # Each pod's process is watched once, under its pod's name (never merged as `sglang-30000`).
    by_container = {ls["container_id"]: ls["server"] for ls in scrape.labelsets("stallwatch_server_info")}
    assert {by_container.get(stalled.container_id), by_container.get(healthy.container_id)} == {
        "llm/kimi-0", "llm/qwen-0"}


def test_kubelet_rotation_and_container_restart(exporter, tmp_path: Path, stack: contextlib.ExitStack) -> None:
    pod = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=1, shards=8), namespace="llm",
                                  pod="r-0", final="stall", tp=1, port=free_port()))
    e = start(exporter, tmp_path)
    first = pod.log_node_path
    e.wait_for(lambda s: phase(s, "llm/r-0") == "loading_weights", timeout=30)
    pod.rotate()  # 0.log -> 0.log.<date>; the runtime reopens a fresh 0.log
    pod.restart(t.sglang_healthy(tp=1), final="serve")  # a new container: 1.log
    scrape = e.wait_for(lambda s: phase(s, "llm/r-0") == "serving"
                        and s.log("stallwatch_log_up", server="llm/r-0", path=pod.log_node_path) == 1 and s,
                        timeout=40, what="the restarted container's log")
    assert pod.log_node_path.endswith("/1.log") and first.endswith("/0.log")
    assert info(scrape, "llm/r-0")["container_id"] == pod.container_id
    assert scrape.value("stallwatch_log_events_total", server="llm/r-0", event="server_restart") >= 1


def _series(scrape: Scrape, server: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(sample.name, tuple(sorted(sample.labels.items()))) for family in scrape.families.values()
            for sample in family.samples if sample.labels.get("server") == server}


def test_a_container_restart_makes_two_new_series(exporter, tmp_path: Path, stack: contextlib.ExitStack) -> None:
    """A container restart in a pod (a new container ID, the next `<n>.log`) made about 16 new series per server
    (docs/research/fleet-scale.md): the probe's and the log's families carried the URL and the log path. Now only
    `server_info` (the container ID) and `log_info` (the path) are new; the first restart adds its `server_restart`
    event's series once, so the second one is counted."""
    pod = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=1, shards=8), namespace="llm",
                                  pod="c-0", final="stall", tp=1, port=free_port()))
    e = start(exporter, tmp_path)

    def settled(s: Scrape) -> Scrape | None:
        refused = s.value("stallwatch_probe_failures_total", server="llm/c-0", probe="health", reason="refused")
        return s if (phase(s, "llm/c-0") == "loading_weights" and info(s, "llm/c-0")["container_id"] == pod.container_id
                     and s.log("stallwatch_log_up", server="llm/c-0", path=pod.log_node_path) == 1
                     and (refused or 0) >= 1 and s.value("stallwatch_weight_shards_loaded", server="llm/c-0") == 8
                     ) else None

    e.wait_for(settled, timeout=30, what="the first container")
    pod.restart(t.sglang_until_shards(tp=1, shards=8))
    before = _series(e.wait_for(settled, timeout=40, what="the second container"), "llm/c-0")
    pod.restart(t.sglang_until_shards(tp=1, shards=8))
    after = _series(e.wait_for(settled, timeout=40, what="the third container"), "llm/c-0")
    new = after - before
    assert sorted(name for name, _ in new) == ["stallwatch_log_info", "stallwatch_server_info"], new
    assert dict(next(labels for name, labels in new if name == "stallwatch_log_info"))["path"] == pod.log_node_path


def test_a_line_split_into_cri_partial_pieces_is_matched_whole(exporter, tmp_path: Path,
                                                                stack: contextlib.ExitStack) -> None:
    # The marker straddles containerd's 16 KiB split: only the joined line matches.
    prefix = "[2026-11-20 09:14:13 TP0] " + "x" * (16384 - 30)
    long_line = prefix + " Load weight begin. avail mem=78.54 GB " + "y" * 24000 + "\n"
    transcript = t.sglang_until_shards(tp=1, shards=8).split("Load weight begin")[0].rsplit("\n", 1)[0] + "\n"
    pod = stack.enter_context(Pod(tmp_path, "sglang", transcript + long_line, namespace="llm", pod="long-0",
                                  final="stall", tp=1, port=free_port()))
    e = start(exporter, tmp_path)
    e.wait_for(lambda s: phase(s, "llm/long-0") == "loading_weights", timeout=30, what="the joined line")
    raw = pod.log_path.read_text()
    assert " P " in raw and raw.count("\n") > transcript.count("\n") + 1  # really split on disk


def test_docker_json_file_and_local_driver(exporter, tmp_path: Path, stack: contextlib.ExitStack) -> None:
    readable = stack.enter_context(DockerContainer(tmp_path, "vllm", t.vllm_healthy(tp=1), name="vllm-0",
                                                   final="serve", tp=1, port=8000, host="0.0.0.0"))
    stack.enter_context(DockerContainer(tmp_path, "vllm", t.vllm_healthy(tp=1), name="vllm-1",
                                        driver="local", final="serve", tp=1, port=8000, host="0.0.0.0"))
    e = start(exporter, tmp_path)
    url = f"http://{readable.address}:8000/health"
    # Its follower's first poll says why (log_up reads 0 before any poll, too); vllm-0's log read to its end.
    scrape = e.wait_for(lambda s: s.probe("stallwatch_probe_success", server="vllm-0", url=url) == 1
                        and s.value("stallwatch_weight_shards_loaded", server="vllm-0") == 30
                        and "not readable outside dockerd" in e.log.read_text() and s, timeout=30)
    assert phase(scrape, "vllm-0") == "serving"
    assert scrape.value("stallwatch_weight_shards_loaded", server="vllm-0") == 30  # its json-file log, decoded
    assert info(scrape, "vllm-0")["runtime"] == "docker" and info(scrape, "vllm-0")["container"] == "vllm-0"
    assert scrape.log("stallwatch_log_up", server="vllm-0", path=readable.log_node_path) == 1
    assert scrape.log("stallwatch_log_up", server="vllm-1", path="docker:vllm-1") == 0


def test_systemd_unit_logs_from_the_journal(exporter, tmp_path: Path, stack: contextlib.ExitStack) -> None:
    unit = stack.enter_context(SystemdUnit(tmp_path, "sglang", t.sglang_until_shards(tp=1, shards=8),
                                           unit="kimi.service", final="stall", tp=1, port=free_port()))
    env = {**unit.env, "PATH": f"{SIM_BIN}:{os.environ['PATH']}"}  # the stand-in journalctl
    e = start(exporter, tmp_path, env=env)
    scrape = e.wait_for(lambda s: phase(s, "kimi.service") == "loading_weights" and s, timeout=30)
    assert scrape.log("stallwatch_log_up", server="kimi.service", path="journal:kimi.service") == 1
    assert scrape.value("stallwatch_weight_shards_loaded", server="kimi.service") == 8
    assert info(scrape, "kimi.service")["unit"] == "kimi.service"


def test_file_log_inside_the_containers_own_mount_namespace(exporter, tmp_path: Path,
                                                             stack: contextlib.ExitStack) -> None:
    """stdout is a file on a tmpfs that only the server's mount namespace has: reachable through /proc/PID/fd."""
    port = free_port()
    transcript = tmp_path / "transcript.txt"
    transcript.write_text(t.sglang_until_shards(tp=1, shards=8))
    scenario = tmp_path / "scenario.json"
    scenario.write_text(f'{{"transcript": "{transcript}", "final": "stall"}}')
    private = tmp_path / "private"
    private.mkdir()
    script = (f"mount -t tmpfs tmpfs {private} && exec {sys.executable} -m sglang.launch_server --port {port} "
              f"--tp 1 --model-path m > {private}/engine.log 2>&1")
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script], start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(SIM_PKGS), "ENGINESIM_SCENARIO": str(scenario)})
    stack.callback(proc.wait)
    stack.callback(os.killpg, proc.pid, signal.SIGKILL)
    e = start(exporter, tmp_path)
    name = f"sglang-{port}"
    scrape = e.wait_for(lambda s: phase(s, name) == "loading_weights" and s, timeout=30)
    assert not (private / "engine.log").exists()  # not in the exporter's mount namespace
    assert scrape.log("stallwatch_log_up", server=name, path=f"{private}/engine.log") == 1
    assert scrape.value("stallwatch_weight_shards_loaded", server=name) == 8


@pytest.mark.parametrize("enter_netns", [False, True])
def test_server_on_loopback_only_inside_its_pod(exporter, tmp_path: Path, stack: contextlib.ExitStack,
                                                enter_netns: bool) -> None:
    """SGLang's default bind (127.0.0.1) inside a pod: no address outside reaches it. Without `enter_netns` the
    probe is not made (unreachable, no probe_success sample); with it, the probe runs inside the namespace."""
    pod = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_healthy(tp=1), namespace="llm", pod="lo-0",
                                  final="serve", tp=1, port=30000, host="127.0.0.1"))
    e = start(exporter, tmp_path, extra=f"probe: {{enter_netns: {str(enter_netns).lower()}}}\n")
    url = "http://127.0.0.1:30000/health"
    if enter_netns:
        scrape = e.wait_for(lambda s: s.probe("stallwatch_probe_success", server="llm/lo-0", url=url) == 1 and s,
                            timeout=30, what="a probe from inside the pod's network namespace")
        assert scrape.probe("stallwatch_probe_failures_total", server="llm/lo-0", url=url, reason="unreachable") == 0
    else:
        scrape = e.wait_for(lambda s: (s.probe("stallwatch_probe_failures_total", server="llm/lo-0", url=url,
                                               reason="unreachable") or 0) >= 2 and s, timeout=30)
        # (other servers that run on this machine may have samples)
        assert all(labels["server"] != "llm/lo-0" for labels in scrape.labelsets("stallwatch_probe_success"))
        assert "--host 0.0.0.0" in e.get("/")[1]
    assert scrape.value("stallwatch_server_listening", server="llm/lo-0", port="30000") == 1
    assert pod.address not in url


def test_names_never_merge_two_servers(exporter, engine, tmp_path: Path, stack: contextlib.ExitStack) -> None:
    """Two servers in one pod get `<namespace>/<pod>/<container>`; two bare processes on one port (each in its
    own network namespace, unknown to any runtime) get `<engine>-<port>` and `<engine>-<port>-2`, one warning."""
    first = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=1, shards=8), namespace="llm",
                                    pod="duo-0", container="main", final="stall", tp=1, port=free_port()))
    second = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=1, shards=4), namespace="llm",
                                     pod="duo-0", container="draft", final="stall", tp=1, port=free_port()))
    port = free_port()
    bare = [stack.enter_context(Netns()) for _ in range(2)]
    sims = [engine("sglang", t.sglang_until_shards(tp=1, shards=8), final="stall", tp=1, port=port,
                   log_name=f"bare-{i}.log", prefix=ns.exec_prefix()) for i, ns in enumerate(bare)]
    e = start(exporter, tmp_path)
    names = {"llm/duo-0", "llm/duo-0/draft", f"sglang-{port}", f"sglang-{port}-2"}
    scrape = e.wait_for(lambda s: names <= {ls["server"] for ls in s.labelsets("stallwatch_server_up")} and s,
                        timeout=30, what="four servers, none merged")
    assert {info(scrape, n)["container"] for n in ("llm/duo-0", "llm/duo-0/draft")} == {"main", "draft"}
    assert all(scrape.value("stallwatch_server_up", server=n) == 1 for n in names)
    assert e.log.read_text().count(f"two servers would be named sglang-{port}") == 1
    assert len({first.container_id, second.container_id}) == 2 and len(sims) == 2


@pytest.mark.root
def test_stats_lines_and_page_of_a_vllm_in_a_cri_pod(exporter, tmp_path: Path) -> None:
    """In a pod: the stats lines come through containerd's CRI log (framing removed), the page from the pod IP."""
    with Pod(tmp_path, "vllm", transcripts.vllm_healthy(tp=1), namespace="llm", pod="busy-0", final="serve", tp=1,
             port=8000, host="0.0.0.0", work=BUSY):
        e = exporter(config=CONFIG, args=(f"--path.rootfs={tmp_path / 'root'}",))

        def figures(s: Scrape) -> Scrape | None:
            return s if all(_value(s, "engine_requests_running", "llm/busy-0", source) == 8
                            and (_value(s, "engine_generated_tokens_total", "llm/busy-0", source) or 0) > 0
                            for source in ("metrics", "log")) else None

        s = e.wait_for(figures, timeout=30, what="figures of the pod from its page and its CRI log")
        assert _value(s, "engine_requests_waiting", "llm/busy-0", "log") == 2
        assert _value(s, "engine_metrics_up", "llm/busy-0") == 1


@pytest.mark.root
def test_pod_container_and_unit_pages_show_the_engines_own_lines(tmp_path: Path, exporter) -> None:
    """CRI, json-file and journal framing are gone from the lines shown: the tail sees the decoded text."""
    last = "Loading safetensors checkpoint shards: 100% Completed | 8/8"
    log = transcripts.sglang_until_shards(tp=1, shards=8)
    with contextlib.ExitStack() as stack:
        pod = stack.enter_context(Pod(tmp_path, "sglang", log, namespace="llm", pod="kimi-0", final="stall", tp=1,
                                      port=free_port()))
        docker = stack.enter_context(DockerContainer(tmp_path, "sglang", log, name="kimi-docker", final="stall",
                                                     tp=1, port=free_port()))
        unit = stack.enter_context(SystemdUnit(tmp_path, "sglang", log, unit="kimi.service", final="stall", tp=1,
                                               port=free_port()))
        e = exporter(config="discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
                            "web: {show_evidence: true, history_interval: 1s}\n",
                     args=(f"--path.rootfs={tmp_path / 'root'}",),
                     env={**unit.env, "PATH": f"{SIM_BIN}:{os.environ['PATH']}"})  # the stand-in journalctl
        for server, runtime in ((pod.name, "runtime kubernetes (namespace llm, pod kimi-0"),
                                (docker.name, "runtime docker (container kimi-docker)"),
                                (unit.name, "runtime systemd (unit kimi.service)")):
            page = poll(lambda s=server: (lambda r: r[1] if r[0] == 200 and last in r[1] else None)(
                e.get(status_path(s))), timeout=30, what=f"the last shard line on {server}'s page")
            assert runtime in page, page[:1500]
            lines = re.findall(r"^  \| (.*)$", page, re.MULTILINE)
            assert lines[-1].startswith(last) and lines[0].startswith("[2026-11-20 09:14:02] server_args="), lines
            assert not [line for line in lines if " stdout F " in line or '{"log":' in line or "MESSAGE" in line]
