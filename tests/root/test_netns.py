"""Probing inside real network namespaces, and the unprivileged view."""

from __future__ import annotations

import errno
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stallwatch.discovery.netns import (
    PROBE_THREAD_PREFIX,
    choose_address,
    listening,
    local_addresses,
    netns_inode,
    parse_tcp,
    run_in_netns,
    same_netns,
)
from support.harness import poll

TIME_WAIT = 0x06


def has_cap_sys_admin() -> bool:
    """CAP_SYS_ADMIN (bit 21) in our effective set: what setns(2) needs."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 21 & 1)
    return False


SERVER = textwrap.dedent(
    """\
    import http.server, socket, sys
    host, port = sys.argv[1], int(sys.argv[2])
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()  # no Content-Length: the server closes first, its side goes TIME_WAIT
            self.wfile.write(b"stallwatch-netns-ok")
        def log_message(self, *args):
            pass
    class Server(http.server.HTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sys.stdin.readline()  # bind only when told, so the test sees the port closed first
    Server((host, port), Handler).serve_forever()
    """
)


@dataclass
class Pod:
    """A throwaway network namespace reached over a veth pair, with a process parked in it."""

    name: str
    host_ip: str
    pod_ip: str
    holder: subprocess.Popen[bytes]
    inode: int


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def free_subnet() -> int:
    """X such that nothing here uses 198.18.X.0/30."""
    used = ip("-4", "-o", "addr").stdout + ip("-4", "route", "show", "table", "all").stdout
    for x in random.sample(range(256), 256):
        if f"198.18.{x}." not in used:
            return x
    pytest.skip("every 198.18.X.0/30 is in use here")


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    if os.geteuid() != 0 or not has_cap_sys_admin():
        pytest.skip("creating network namespaces needs root (CAP_SYS_ADMIN)")
    if shutil.which("ip") is None:
        pytest.skip("iproute2 `ip` is not installed")
    tag = f"{random.getrandbits(32):08x}"
    name, host_if, pod_if = f"sw-test-{tag}", f"swh{tag}", f"swp{tag}"
    x = free_subnet()
    host_ip, pod_ip = f"198.18.{x}.1", f"198.18.{x}.2"
    holder: subprocess.Popen[bytes] | None = None
    made = ip("netns", "add", name)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {made.stderr.strip()}")
    try:
        for args in (
            ["link", "add", host_if, "type", "veth", "peer", "name", pod_if, "netns", name],
            ["addr", "add", f"{host_ip}/30", "dev", host_if],
            ["link", "set", host_if, "up"],
            ["-n", name, "addr", "add", f"{pod_ip}/30", "dev", pod_if],
            ["-n", name, "link", "set", pod_if, "up"],
            ["-n", name, "link", "set", "lo", "up"],
        ):
            done = ip(*args)
            assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"
        inode = os.stat(f"/run/netns/{name}").st_ino
        holder = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "300"])
        poll(lambda: netns_inode("/proc", holder.pid) == inode,
             what="the holder process to enter the namespace")
        yield Pod(name, host_ip, pod_ip, holder, inode)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait(10)
        ip("link", "del", host_if)  # takes the peer with it
        ip("netns", "del", name)


def http_get(host: str, port: int) -> bytes:
    """GET / with no proxy involved (http.client ignores *_proxy variables)."""
    conn = http.client.HTTPConnection(host, port, timeout=3)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        conn.close()


def free_port(pod: Pod) -> int:
    """A port with no socket in our namespace or the pod's."""
    while True:
        port = random.randrange(20000, 60000)
        rows = parse_tcp(Path("/proc/self/net/tcp").read_text(), False)
        rows += parse_tcp(Path(f"/proc/{pod.holder.pid}/net/tcp").read_text(), False)
        if all(s.port != port for s in rows):
            return port


@pytest.mark.process
def test_unprivileged_view(tmp_path: Path) -> None:
    """As uid 65534: net/tcp of another user's process is readable, its ns/net is not, setns is refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to uid 65534 in a child")
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    if any(m[1] == "/proc" and "hidepid=" in m[3] and "hidepid=0" not in m[3] for m in mounts):
        pytest.skip("/proc is mounted with hidepid: other users' processes are invisible")
    code = textwrap.dedent(
        """\
        import json, os, sys
        from stallwatch.discovery.netns import listening, netns_inode, run_in_netns, same_netns
        root_pid = int(sys.argv[1])  # the test process, still root
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        out = {
            "tcp": listening("/proc", root_pid, 1),
            "ns": netns_inode("/proc", root_pid),
            "same": same_netns("/proc", root_pid),
        }
        try:
            run_in_netns("/proc", os.getpid(), lambda: 1, timeout=5)
            out["setns"] = "ran"
        except PermissionError as err:
            out["setns"] = ["PermissionError", err.errno, str(err)]
        print(json.dumps(out))
        """
    )
    command = [sys.executable, "-c", code, str(os.getpid())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=15, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["tcp"] is not None  # world-readable: a list, maybe empty
    assert out["ns"] is None and out["same"] is None
    assert out["setns"][:2] == ["PermissionError", errno.EPERM]
    assert "Operation not permitted" in out["setns"][2]


@pytest.mark.process
@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "pod", "127.0.0.1"])
def test_real_namespace(pod: Pod, tmp_path: Path, bind: str) -> None:
    host = pod.pod_ip if bind == "pod" else bind
    port = free_port(pod)
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = subprocess.Popen(
        ["ip", "netns", "exec", pod.name, sys.executable, str(script), host, str(port)],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert server.stdin is not None
        poll(lambda: netns_inode("/proc", server.pid) == pod.inode,
             what="the server to enter the namespace")
        assert listening("/proc", pod.holder.pid, port) == []
        server.stdin.write(b"go\n")
        server.stdin.flush()
        poll(lambda: bool(listening("/proc", pod.holder.pid, port)),
             what=f"a listener on port {port}")
        binds = listening("/proc", server.pid, port)
        assert binds == [host]
        assert listening("/proc", pod.holder.pid, port) == [host]
        assert listening("/proc", os.getpid(), port) == []  # not in ours
        own = local_addresses("/proc", server.pid)
        assert own == [pod.pod_ip]
        assert same_netns("/proc", server.pid) is False
        assert same_netns("/proc", os.getpid()) is True

        kind, address = choose_address(binds, own)
        if bind == "127.0.0.1":
            assert (kind, address) == ("loopback_only", "127.0.0.1")
            with pytest.raises(OSError):
                http_get(pod.pod_ip, port)

            def probe() -> tuple[bytes, int]:
                return http_get("127.0.0.1", port), os.stat("/proc/thread-self/ns/net").st_ino

            body, inode = run_in_netns("/proc", server.pid, probe, timeout=10)
            assert (body, inode) == (b"stallwatch-netns-ok", pod.inode)
            assert same_netns("/proc", os.getpid()) is True  # the caller never moved
            assert os.stat("/proc/thread-self/ns/net").st_ino != pod.inode
        else:
            assert (kind, address) == ("address", pod.pod_ip)
            assert http_get(address, port) == b"stallwatch-netns-ok"

        server.terminate()
        server.wait(10)
        poll(lambda: listening("/proc", pod.holder.pid, port) == [],
             what=f"port {port} to close")
        # The server closed first, so its side of our GET is in TIME_WAIT on that port, and does not count.
        table = "tcp6" if ":" in host else "tcp"
        rows = parse_tcp(Path(f"/proc/{pod.holder.pid}/net/{table}").read_text(), ":" in host)
        assert any(s.port == port and s.state == TIME_WAIT for s in rows)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()
        if server.stdin is not None:
            server.stdin.close()


def test_run_in_netns_own_namespace_result_errors_and_thread() -> None:
    seen: dict[str, object] = {}

    def fn() -> int:
        me = threading.current_thread()
        seen.update(name=me.name, daemon=me.daemon, main=me is threading.main_thread())
        return 42

    assert run_in_netns("/proc", os.getpid(), fn, 5) == 42
    assert seen == {"name": f"{PROBE_THREAD_PREFIX}-{os.getpid()}", "daemon": True, "main": False}

    class Boom(Exception):
        pass

    boom = Boom("from the probe")

    def fails() -> None:
        raise boom

    with pytest.raises(Boom) as info:
        run_in_netns("/proc", os.getpid(), fails, 5)
    assert info.value is boom


def test_run_in_netns_timeout_leaves_the_thread_to_finish() -> None:
    release = threading.Event()
    finished = threading.Event()

    def slow() -> None:
        release.wait(10)
        finished.set()

    start = time.monotonic()
    with pytest.raises(TimeoutError, match="still running"):
        run_in_netns("/proc", os.getpid(), slow, 0.2)
    assert time.monotonic() - start < 5
    assert not finished.is_set()
    release.set()
    poll(lambda: not any(t.name.startswith(PROBE_THREAD_PREFIX) for t in threading.enumerate()),
             what="the abandoned probe thread to end")
    assert finished.is_set()
