"""Issue 21, hostile neighbours round two: what discovery takes from other users' processes (their cgroups, network
namespaces, numbers, names, argv and the text they print). Each test reproduces one defect of
`../shared/research/audit-2026-12-01.md` (numbered as there) and fails without its fix."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from stallwatch.config.reader import ConfigError
from support import transcripts as t
from support.cluster import Node, require_nodes
from support.configs import parse
from support.harness import Engine, Exporter, Scrape, diagnose, free_port, poll
from support.sandbox import Cgroup, Netns, require_root

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


# --- 1. a user's own cgroup does not pass for another pod ----------------------------------------------------------

POD_UID, CID = "0f3c2a4e-1b2c-4d5e-8f90-a1b2c3d4e5f6", "ab" * 32
SECRET = "DB_PASSWORD=hunter2-SECRET"
# Sleeps with an engine's argv, as the audit's `sleeper` does; the system's interpreter, which `nobody` can run
# in a user namespace of its own too (not one under root's home).
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
SLEEPER = [PYTHON, "-c", "import time; time.sleep(600)", "-m", "sglang.launch_server", "--port"]


def _billing_db_pod(rootfs: Path) -> None:
    """What a node already has: a non-inference pod's root-only CRI log, named after its pod UID and container."""
    pod_dir = rootfs / f"var/log/pods/prod_billing-db_{POD_UID}"
    (pod_dir / "db").mkdir(parents=True)
    pod_dir.chmod(0o750)
    log = pod_dir / "db" / "0.log"
    log.write_text(f"2026-12-01T18:00:01.000000000Z stdout F connecting with {SECRET} token=sk-live-abc123\n")
    log.chmod(0o600)
    (rootfs / "var/log/containers").mkdir(parents=True)
    (rootfs / f"var/log/containers/billing-db_prod_db-{CID}.log").symlink_to(
        f"/var/log/pods/prod_billing-db_{POD_UID}/db/0.log")


@pytest.mark.root
@pytest.mark.parametrize(("cgroup", "wrapper"), [
    # systemd delegates user@UID.service to its user (Delegate=yes): it can make cgroups there, named as it likes.
    (f"user.slice/user-65534.slice/user@65534.service/app.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/"
     f"cri-containerd-{CID}.scope", []),
    # A pod's cgroup path elsewhere (delegated some other way), the process in the node's own mount namespace...
    (f"kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope", []),
    # ... or in a mount namespace of its own user's making.
    (f"kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
     ["unshare", "--user", "--map-root-user", "--mount", "--"]),
], ids=["user-delegated", "node-mounts", "user-namespace"])
def test_a_users_own_cgroup_does_not_pass_for_another_pod(exporter, tmp_path: Path, cgroup: str,
                                                         wrapper: list[str]) -> None:
    require_root()
    rootfs = tmp_path / "root"
    _billing_db_pod(rootfs)
    port = free_port()
    e = exporter(config=FAST + "web: {show_evidence: true}\n", args=(f"--path.rootfs={rootfs}",))
    with Cgroup(cgroup) as group:
        neighbour = subprocess.Popen([*NOBODY, *wrapper, *SLEEPER, str(port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        try:
            main = poll(lambda: next((p.pid for p in [psutil.Process(neighbour.pid), *psutil.Process(
                neighbour.pid).children(recursive=True)] if "sglang.launch_server" in p.cmdline()), None),
                what="the neighbour's process")
            group.add(main)
            scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=f"sglang-{port}") == 1 and s,
                                timeout=15, what="the neighbour's process, read as a host process")
            assert {ls["server"] for ls in scrape.labelsets("stallwatch_server_info")} >= {f"sglang-{port}"}
            assert "prod/billing-db" not in scrape.text
            assert scrape.value("stallwatch_server_info", server=f"sglang-{port}", runtime="host", engine="sglang",
                                model="", tensor_parallel="", namespace="", pod="", container="", container_id="",
                                unit="") == 1
            status, page = e.get(f"/servers/sglang-{port}")
            assert status == 200 and SECRET not in page
            assert e.get("/servers/prod%2Fbilling-db")[0] == 404
        finally:
            neighbour.kill()
            neighbour.wait()
            group.kill()


# --- 2. no probe or page fetch to an address from a namespace its own user made ------------------------------------

# Answers every GET with 200 and writes its request line to the file named first: who dialled it.
RECORDER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as seen:
            seen.write(self.path + "\\n")
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args): pass
HTTPServer(("0.0.0.0", int(sys.argv[2])), H).serve_forever()
"""


@pytest.mark.root
def test_a_user_namespace_address_is_never_dialled_from_the_node(exporter, tmp_path: Path, shared_dir: Path) -> None:
    """A victim's address (in a namespace root made, reached from the node over a veth) put by `nobody` on the
    loopback of a network namespace of its own, with a vLLM argv listening there: the exporter dials neither the
    probe nor /metrics from the node's namespace (that would reach the victim and export its answers), and counts
    the probe unreachable."""
    require_root()
    port = free_port()
    seen = shared_dir / "victim-requests"
    seen.touch()
    with Netns() as victim:
        server = subprocess.Popen([*victim.exec_prefix(), PYTHON, "-c", RECORDER, str(seen), str(port)])
        try:
            poll(lambda: _answers(victim.address, port), what="the victim's server")
            seen.write_text("")
            e = exporter(config=FAST + "engine_metrics: {interval: 0.2s, timeout: 1s}\n")
            claim = (f"ip addr add {victim.address}/32 dev lo && ip link set lo up && exec {PYTHON} -c "
                     f"'{RECORDER}' {seen}.attacker {port} -m vllm.entrypoints.openai.api_server --port {port}")
            neighbour = subprocess.Popen([*NOBODY, "unshare", "--user", "--map-root-user", "--net", "--", "sh", "-c",
                                          claim], cwd=shared_dir)
            try:
                name = f"vllm-{port}"
                e.wait_for(lambda s: (s.value("stallwatch_probe_failures_total", server=name,
                                              url=f"http://{victim.address}:{port}/health", reason="unreachable")
                                      or 0) >= 3, timeout=20, what="the neighbour's probe counted unreachable")
                assert seen.read_text() == "", "the exporter dialled the victim"
                scrape = e.scrape()
                assert scrape.value("stallwatch_probe_success", server=name) is None
                assert scrape.value("stallwatch_engine_requests_running", server=name, source="metrics") is None
            finally:
                neighbour.kill()
                neighbour.wait()
        finally:
            server.kill()
            server.wait()


def _answers(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{address}:{port}/ready", timeout=1) as r:
        return r.status == 200
    return False


# --- 3. discovered servers are capped, in all and per user -----------------------------------------------------


@pytest.mark.root
def test_discovered_servers_are_capped_per_user_and_in_all(tmp_path: Path) -> None:
    """8 sleeping processes of one user with an engine's argv (the audit's 200, scaled): 5 are watched (its cap),
    the rest counted skipped and logged once; root's own servers beside them are still found until the cap in all.
    On a node of its own (support.cluster): the exporter sees no other process of the machine."""
    require_nodes()
    node = Node(tmp_path, "capped")
    try:
        config = FAST.replace("forget_after: 30s", "forget_after: 30s, max_servers: 7, max_servers_per_user: 5")
        e = Exporter(node.tmp, config=config, listen_host="0.0.0.0", prefix=node.prefix(), url_host=node.address)
        ports = list(range(41001, 41012))
        for i, port in enumerate(ports):
            subprocess.Popen([*node.prefix(), *(NOBODY if i < 8 else []), *SLEEPER, str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def watched(s: Scrape) -> set[int]:
            return {port for port in ports if s.value("stallwatch_server_up", server=f"sglang-{port}") == 1}

        scrape = e.wait_for(lambda s: len(watched(s)) == 7 and s.value("stallwatch_discovery_skipped_processes") == 4
                            and s, timeout=20, what="7 servers watched, 4 skipped")
        assert len(watched(scrape) & set(ports[:8])) == 5  # the user's cap
        assert len(watched(scrape) & set(ports[8:])) == 2  # root's, until the cap in all
        log = e.log.read_text()
        assert log.count("discovered servers are the cap (discovery.max_servers_per_user)") == 1, log
        assert log.count("discovered servers are the cap (discovery.max_servers)") == 1, log
        e.stop()
    finally:
        node.close()


# --- 10. a main process that execs is read anew; a shell's script is not a server ---------------------------------

# A Python process whose argv names a vLLM server on `--port FIRST`, then execs (same pid and start time) into the
# command after `--`: the real server, on another port.
EXEC_LATER = ("import os, sys, time; time.sleep(1.5); rest = sys.argv[sys.argv.index('--') + 1:]; "
              "os.execv(rest[0], rest)")


def test_a_main_process_that_execs_is_read_anew(exporter, engine) -> None:
    e = exporter(config=FAST)
    first = free_port()
    sim = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1, work={"running": 0, "waiting": 0},
                 prefix=[sys.executable, "-c", EXEC_LATER, "-m", "vllm.entrypoints.openai.api_server", "--port",
                         str(first), "--"])
    name = f"vllm-{first}"
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, what="the process before its exec")
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_listening", server=name, port=str(sim.port)) == 1
                        and s.value("stallwatch_probe_success", server=name,
                                    url=f"http://127.0.0.1:{sim.port}/health") == 1 and s,
                        timeout=20, what="the port and probe of the program it exec'd")
    assert scrape.value("stallwatch_startup_phase", server=name, phase="serving") == 1
    assert scrape.value("stallwatch_server_listening", server=name, port=str(first)) is None


def test_a_shell_scripts_process_is_not_the_server_it_starts(exporter, engine, tmp_path: Path) -> None:
    """`sh -c 'sleep 1; exec python -m vllm... --port N'`, as manifests and entrypoints write it: the shell is not
    discovered (its port would be read as the default 8000, a healthy idle server paged as never listening); the
    program it execs is, on its own port."""
    e = exporter(config=FAST)
    sim = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1, work={"running": 0, "waiting": 0},
                 shell="sleep 1")
    e.wait_for(lambda s: s.value("stallwatch_probe_success", server=sim.name,
                                 url=f"http://127.0.0.1:{sim.port}/health") == 1, timeout=20,
               what="the program the script execs")
    assert f"(pid {sim.proc.pid}, host)" in e.log.read_text()
    assert "vllm-8000" not in e.log.read_text()


# --- 12. no other user's text drives the operator's terminal ----------------------------------------------------

CSI_OVERWRITE = "\x1b[2K\x1b[1AVERDICT: HEALTHY"  # erase the line above (the verdict) and forge it
OSC_CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"  # writes the operator's clipboard in terminals that allow it
OSC_TITLE = "\x1b]0;OWNED\x07"


def test_diagnose_prints_no_escape_sequence_from_argv_paths_or_lines(engine, tmp_path: Path) -> None:
    lines = t.sglang_until_shards(tp=1) + f"[2026-11-20 09:15:00] {OSC_CLIPBOARD}{CSI_OVERWRITE}\n"
    sim = engine("sglang", lines, final="stall", tp=1, log_name=f"out{OSC_TITLE}.log")
    poll(lambda: sim.log.exists() and "VERDICT" in sim.log.read_text(), what="the hostile line")
    out = diagnose(tmp_path, sim.name)
    assert out.returncode == 1, out.stderr
    assert not [c for c in out.stdout if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f], out.stdout
    # Shown as text: the OSC of the line (its CSI codes are stripped as colours are) and of the log's path.
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07VERDICT: HEALTHY" in out.stdout
    assert "out\\x1b]0;OWNED\\x07.log" in out.stdout
    assert out.stdout.splitlines()[1].startswith("VERDICT: STALLED")


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
