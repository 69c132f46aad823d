"""Discovery against hostile users in real namespaces and cgroups: forged pods, user-namespace addresses, caps on
the number of servers and copies of a configured server's argv."""

from __future__ import annotations

import contextlib
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from support.cluster import Node, require_nodes
from support.configs import FAST_REMEMBERING
from support.harness import NOBODY, Exporter, Scrape, free_port, gpus, poll
from support.programs import SYSTEM_PYTHON as PYTHON
from support.programs import posing_as
from support.sandbox import Cgroup, Netns, require_root

POD_UID, CID = "0f3c2a4e-1b2c-4d5e-8f90-a1b2c3d4e5f6", "ab" * 32


SECRET = "DB_PASSWORD=hunter2-SECRET"


def sleeper(directory: Path) -> list[str]:
    """Sleeps as `sglang serve --port` (the port follows): docs/research/audit-2026-12-01.md's `sleeper`."""
    return [*posing_as(directory, "sglang", python=PYTHON), "serve", "--port"]


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


# Answers every GET with 200 and writes its request line to the file named next to last (the port is last): who
# dialled it.
RECORDER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[-2], "a") as seen:
            seen.write(self.path + "\\n")
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args): pass
HTTPServer(("0.0.0.0", int(sys.argv[-1])), H).serve_forever()
"""


def _answers(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(f"http://{address}:{port}/ready", timeout=1) as r:
        return r.status == 200
    return False


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
def test_a_users_own_cgroup_does_not_pass_for_another_pod(exporter, tmp_path: Path, shared_dir: Path, cgroup: str,
                                                         wrapper: list[str]) -> None:
    """An unprivileged user puts its process in a cgroup named like another pod's container (in its systemd-delegated
    subtree, or a pod's path with the node's mount namespace or one of its own user namespace), so that the exporter,
    as root, would follow that pod's root-only CRI log, show its secret on the status page and take its name
    (docs/research/audit-2026-12-01.md #1). The process is read as a plain host process: no pod identity, no log of
    the pod, no secret on its page and no `/servers/prod%2Fbilling-db`."""
    require_root()
    rootfs = tmp_path / "root"
    _billing_db_pod(rootfs)
    port = free_port()
    e = exporter(config=FAST_REMEMBERING + "web: {show_evidence: true}\n", args=(f"--path.rootfs={rootfs}",))
    with Cgroup(cgroup) as group:
        neighbour = subprocess.Popen([*NOBODY, *wrapper, *sleeper(shared_dir), str(port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        try:
            main = poll(lambda: next((p.pid for p in [psutil.Process(neighbour.pid), *psutil.Process(
                neighbour.pid).children(recursive=True)] if p.cmdline()[-3:-1] == ["serve", "--port"]), None),
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
            e = exporter(config=FAST_REMEMBERING + "engine_metrics: {interval: 0.2s, timeout: 1s}\n")
            vllm = " ".join(posing_as(shared_dir, "vllm", RECORDER, python=PYTHON))
            claim = (f"ip addr add {victim.address}/32 dev lo && ip link set lo up && exec {vllm} serve --port {port} "
                     f"{seen}.attacker {port}")
            neighbour = subprocess.Popen([*NOBODY, "unshare", "--user", "--map-root-user", "--net", "--", "sh", "-c",
                                          claim], cwd=shared_dir)
            try:
                name = f"vllm-{port}"
                e.wait_for(lambda s: (s.probe("stallwatch_probe_failures_total", server=name,
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


@pytest.mark.root
def test_discovered_servers_are_capped_per_user_and_in_all(tmp_path: Path, shared_dir: Path) -> None:
    """8 sleeping processes of one user with an engine's argv (the 200 of docs/research/audit-2026-12-01.md #3,
    scaled): 5 are watched (its cap), the rest counted skipped and logged once; root's own servers beside them are
    still found until the cap in all, and all of them once the user's are gone. On a node of its own
    (support.cluster): the exporter sees no other process of the machine."""
    require_nodes()
    node = Node(tmp_path, "capped")
    try:
        config = FAST_REMEMBERING.replace("forget_after: 30s", "forget_after: 10m, max_servers: 7, "
                                          "max_servers_per_user: 5")
        e = Exporter(node.tmp, config=config, listen_host="0.0.0.0", prefix=node.prefix(), url_host=node.address)
        ports, sleeping = list(range(41001, 41012)), sleeper(shared_dir)
        started = [subprocess.Popen([*node.prefix(), *(NOBODY if i < 8 else []), *sleeping, str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for i, port in enumerate(ports)]

        def watched(s: Scrape) -> set[int]:
            return {port for port in ports if s.value("stallwatch_server_up", server=f"sglang-{port}") == 1}

        scrape = e.wait_for(lambda s: len(watched(s)) == 7 and s.value("stallwatch_discovery_skipped_processes") == 4
                            and s, timeout=20, what="7 servers watched, 4 skipped")
        assert len(watched(scrape) & set(ports[:8])) == 5  # the user's cap
        assert len(watched(scrape) & set(ports[8:])) == 2  # root's, until the cap in all
        log = e.log.read_text()
        assert log.count("discovered servers are the cap (discovery.max_servers_per_user)") == 1, log
        assert log.count("discovered servers are the cap (discovery.max_servers)") == 1, log
        # The user's servers gone: their slots are free at once, not after forget_after (audit 2026-12-02 #10).
        for process in started[:8]:  # nsenter forks: its child is the sleeper
            for child in psutil.Process(process.pid).children(recursive=True):
                child.kill()
            process.wait()
        e.wait_for(lambda s: watched(s) == set(ports[8:]) and s.value("stallwatch_discovery_skipped_processes") == 0,
                   timeout=20, what="root's third server watched once the user's are gone")
        e.stop()
    finally:
        node.close()


@pytest.mark.root
def test_a_neighbours_copy_of_a_configured_servers_argv_is_never_its_main_process(exporter, shared_dir: Path) -> None:
    """Audit 2026-12-02 #5: nobody's copy of the server's argv, started first, was its main process: the server read
    up while root's was down, and each start of the copy counted a relaunch. The server is the uid whose process
    holds GPU memory: root's, and root's relaunch, never the copy (never attached, so none of its starts counts)."""
    require_root()
    port = free_port()
    argv = [*sleeper(shared_dir), str(port)]
    config = ("discovery: {enabled: false, interval: 0.2s}\nlogs: {poll_interval: 0.1s}\n"
              f"servers:\n  - name: real\n    engine: sglang\n    match: {{cmdline: 'sglang serve --port {port}$'}}\n")
    started: list[subprocess.Popen[bytes]] = []

    def start(*prefix: str) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen([*prefix, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return started[-1]

    def main_pid() -> str:
        page = e.get("/servers/?name=real")[1]
        return page.split("main pid ", 1)[-1].split(",", 1)[0]

    def stop(process: subprocess.Popen[bytes]) -> None:
        process.kill()
        process.wait()

    try:
        neighbour = start(*NOBODY)
        poll(lambda: psutil.Process(neighbour.pid).cmdline()[-1:] == [str(port)], what="the copy to run")
        real = start()
        e = exporter(config=config, nvml={"driver": "550.54.15",
                                          "gpus": gpus(1, processes=[{"pid": real.pid, "used": 70e9}])})
        poll(lambda: main_pid() == str(real.pid), timeout=15, what="root's process to be the server's")
        stop(real)
        e.wait_for(lambda s: s.value("stallwatch_server_up", server="real") == 0, timeout=15, what="the server down")
        for _ in range(2):  # the copy restarted while root's server is down
            stop(neighbour)
            neighbour = start(*NOBODY)
        relaunch = start()
        poll(lambda: main_pid() == str(relaunch.pid), timeout=15, what="root's relaunch to be the server's")
        assert e.scrape().value("stallwatch_server_up", server="real") == 1
        assert f"pid {neighbour.pid}" not in e.get("/servers/?name=real")[1]  # never attached: no launch of its own
    finally:
        for process in started:
            stop(process)
