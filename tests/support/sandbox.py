"""Run a simulated engine the way Kubernetes, Docker and systemd run it: for real, as root.

Each sandbox gives the engine (tests/sim/pkgs/enginesim.py, started with harness.ENGINE_COMMANDS) what a
scanner of /proc sees on a real node:

* a cgroup at the path its runtime uses, in the v2 hierarchy and the v1 `pids` and `name=systemd` ones
  (kubernetes/kubernetes pkg/kubelet/cm/cgroup_manager_linux.go, containerd/containerd internal/cri/server/helpers.go,
  moby/moby daemon/oci_linux.go);
* for pods and bridge containers, a network namespace with a veth pair in 198.18.0.0/15 (RFC 2544);
* stdout and stderr on pipes read by tests/sim/bin/cri-shim, which writes the runtime's log format into a node root
  filesystem under `<tmp>/root` (what the exporter gets as `--path.rootfs`).

Everything is removed on context exit or `stop()`, also when a test fails. `require_root()` skips a test, with the
reason, where the kernel features are not available.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gzip
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from support.harness import ENGINE_COMMANDS, poll
from support.paths import SIM_BIN, SIM_PKGS

SHIM = SIM_BIN / "cri-shim"
BENCH_NET = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544 benchmarking range: never routed anywhere
V1_HIERARCHIES = ("pids", "name=systemd")
MAX_LOG_NAME = 255 - len(".log")  # kubelet truncates /var/log/containers names (legacy.go logSymlink)
STOP_SECONDS = 5.0


# ---------------------------------------------------------------------------------------------------------------
# require_root


@functools.lru_cache(maxsize=1)
def _root_problem() -> str | None:
    """Why sandboxes cannot run here, or None. Probes the real operations once per session."""
    if os.geteuid() != 0:
        return "sandbox tests need root (network namespaces, cgroups)"
    if shutil.which("ip") is None:
        return "sandbox tests need iproute2's `ip`"
    probe = f"swprobe{secrets.token_hex(3)}"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if added.returncode != 0:
        return f"`ip netns add` fails here: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    try:
        hierarchies = cgroup_hierarchies()
    except OSError as exc:
        return f"cannot read /proc/self/mountinfo: {exc}"
    if not hierarchies:
        return "no cgroup v2, v1 pids or v1 name=systemd hierarchy is mounted"
    for hierarchy in hierarchies:
        path = hierarchy.mountpoint / probe
        try:
            path.mkdir()
            path.rmdir()
        except OSError as exc:
            return f"cannot create a cgroup under {hierarchy.mountpoint}: {exc}"
    return None


def require_root() -> None:
    """Skip the calling test, saying why, unless we are root and can create netns and cgroups."""
    problem = _root_problem()
    if problem:
        pytest.skip(problem)


# ---------------------------------------------------------------------------------------------------------------
# cgroups


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy: v2 (`controller` "") or a v1 one (`pids`, `name=systemd`)."""

    mountpoint: Path
    version: int
    controller: str


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo (proc(5))."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_hierarchies(mountinfo: str = "/proc/self/mountinfo") -> list[Hierarchy]:
    """The v2 hierarchy and the v1 `pids` and `name=systemd` ones, wherever this machine mounts them."""
    found: dict[str, Hierarchy] = {}
    for line in Path(mountinfo).read_text().splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            key, version = "", 2
        elif tail[0] == "cgroup":
            key = next((opt for opt in tail[2].split(",") if opt in V1_HIERARCHIES), "-")
            version = 1
            if key == "-":
                continue
        else:
            continue
        found.setdefault(key, Hierarchy(Path(_unescape(fields[4])), version, key))
    return list(found.values())


def kubepods_systemd(qos: str, pod_uid: str, container_id: str, runtime: str = "cri-containerd") -> str:
    """kubelet's systemd driver (escapeSystemdCgroupName: `-` in the UID becomes `_`) + the runtime's scope
    (containerd getCgroupsPath `<slice>:cri-containerd:<id>`; CRI-O `crio-<id>.scope`)."""
    uid = pod_uid.replace("-", "_")
    scope = f"{runtime}-{container_id}.scope"
    if qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{uid}.slice/{scope}"
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/{scope}"


def kubepods_cgroupfs(qos: str, pod_uid: str, container_id: str, runtime: str = "cri-containerd") -> str:
    """kubelet's cgroupfs driver: `kubepods/<qos>/pod<uid>/<id>` (CRI-O names the leaf `crio-<id>`)."""
    leaf = f"crio-{container_id}" if runtime == "crio" else container_id
    if qos == "guaranteed":
        return f"kubepods/pod{pod_uid}/{leaf}"
    return f"kubepods/{qos}/pod{pod_uid}/{leaf}"


def docker_systemd(container_id: str) -> str:
    """Docker with the systemd cgroup driver: cgroupsPath `system.slice:docker:<id>`."""
    return f"system.slice/docker-{container_id}.scope"


def docker_cgroupfs(container_id: str) -> str:
    return f"docker/{container_id}"


def systemd_unit(unit: str) -> str:
    """Where systemd puts a system service (systemd.special(7) system.slice)."""
    return f"system.slice/{unit}"


REGISTRY = Path(tempfile.gettempdir()) / "stallwatch-sandbox-cgroups.json"


@contextlib.contextmanager
def _owned_cgroups() -> Iterator[set[str]]:
    """Cgroup directories made by sandboxes of any test process, read and saved under an exclusive lock.

    A shared parent such as kubepods.slice is removed by whichever sandbox leaves it empty, in whatever
    process, and a directory that existed before any sandbox is never removed. The file goes when empty."""
    while True:
        with open(REGISTRY, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                current = os.stat(REGISTRY).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                current = False
            if not current:
                continue  # another process unlinked it while we waited for the lock
            handle.seek(0)
            try:
                owned = set(json.loads(handle.read() or "[]"))
            except ValueError:
                owned = set()
            try:
                yield owned
            finally:
                handle.seek(0)
                handle.truncate()
                if owned:
                    handle.write(json.dumps(sorted(owned)))
                else:
                    REGISTRY.unlink(missing_ok=True)
            return


def _write_pid(procs_file: Path, pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ESRCH: it exited meanwhile
        procs_file.write_text(str(pid))


class Cgroup:
    """One cgroup path made in every hierarchy, so /proc/PID/cgroup of a member shows it on each line."""

    def __init__(self, relative: str, hierarchies: Sequence[Hierarchy] | None = None) -> None:
        self.relative = relative.strip("/")
        self.hierarchies = list(cgroup_hierarchies() if hierarchies is None else hierarchies)
        self.dirs = [h.mountpoint / self.relative for h in self.hierarchies]
        self._chain: list[Path] = []  # every directory on the path, parents first, in each hierarchy
        self._leaves: list[Path] = []  # leaves this Cgroup made

    def __enter__(self) -> Cgroup:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def create(self) -> Cgroup:
        """Make the path in each hierarchy. The leaf must be new: never adopt someone else's cgroup."""
        if not self.hierarchies:
            raise RuntimeError("no cgroup hierarchy to create the sandbox cgroup in")
        try:
            with _owned_cgroups() as owned:
                for hierarchy in self.hierarchies:
                    self._make(hierarchy.mountpoint, Path(self.relative).parts, owned)
        except BaseException:
            self.remove()
            raise
        return self

    def _make(self, root: Path, parts: Sequence[str], owned: set[str]) -> None:
        current = root
        for depth, part in enumerate(parts, 1):
            current /= part
            try:
                current.mkdir()
                owned.add(str(current))
            except FileExistsError:
                if depth == len(parts):
                    raise
            self._chain.append(current)
        self._leaves.append(current)

    def add(self, pid: int) -> None:
        for procs in self.procs_files:
            procs.write_text(str(pid))

    def pids(self) -> set[int]:
        """Members of the leaf and of any cgroup below it, in every hierarchy."""
        found: set[int] = set()
        for leaf in self.dirs:
            for procs in leaf.rglob("cgroup.procs") if leaf.is_dir() else ():
                with contextlib.suppress(OSError):
                    found.update(int(pid) for pid in procs.read_text().split())
        return found

    def kill(self, timeout: float = STOP_SECONDS) -> None:
        """SIGKILL every member until none is left (only our own processes are ever inside)."""
        deadline = time.monotonic() + timeout
        while (members := self.pids()) and time.monotonic() < deadline:
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    def remove(self) -> None:
        """Move leftover members to the hierarchy root, then rmdir bottom-up what this process created."""
        for hierarchy, leaf in zip(self.hierarchies, self.dirs, strict=True):
            if leaf in self._leaves:
                self._evacuate(hierarchy, leaf)
        with _owned_cgroups() as owned:
            for path in reversed(self._chain):
                if str(path) not in owned:
                    continue
                try:
                    path.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    continue  # EBUSY: another sandbox's cgroup is still below it; that one removes it
                owned.discard(str(path))
        self._chain, self._leaves = [], []

    @staticmethod
    def _evacuate(hierarchy: Hierarchy, leaf: Path) -> None:
        root_procs = hierarchy.mountpoint / "cgroup.procs"
        for below, dirs, _files in os.walk(leaf, topdown=False):
            with contextlib.suppress(OSError):
                for pid in Path(below, "cgroup.procs").read_text().split():
                    _write_pid(root_procs, int(pid))
            for name in dirs:
                with contextlib.suppress(OSError):
                    Path(below, name).rmdir()


# ---------------------------------------------------------------------------------------------------------------
# network namespaces


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def _no_link_local(device: str, ns: str | None = None) -> None:
    """Keep IPv6 from giving the veth an fe80:: address (kernels without IPv6 refuse; nothing to do then)."""
    subprocess.run(["ip", *(["-n", ns] if ns else []), "link", "set", device, "addrgenmode", "none"],
                   capture_output=True)


def _used_bench_networks() -> list[ipaddress.IPv4Network]:
    used = []
    for match in re.finditer(r"\binet (\S+)", _ip("-o", "-4", "addr", "show")):
        network = ipaddress.IPv4Interface(match.group(1)).network
        if network.overlaps(BENCH_NET):
            used.append(network)
    return used


def _free_block() -> ipaddress.IPv4Network:
    """A random /30 in 198.18.0.0/15 that no interface here uses (concurrent runs pick different ones)."""
    used = _used_bench_networks()
    base = int(BENCH_NET.network_address)
    for _ in range(200):
        block = ipaddress.IPv4Network((base + 4 * random.randrange(BENCH_NET.num_addresses // 4), 30))
        if not any(block.overlaps(net) for net in used):
            return block
    raise RuntimeError("no free /30 left in 198.18.0.0/15")


class Netns:
    """A network namespace `sw<hex>` joined to ours by a veth pair: host end 198.18.X.1/30, `eth0` inside
    198.18.X.2/30 (as a pod's), `lo` up. No IPv6 link-local addresses, no routes beyond the /30."""

    def __init__(self) -> None:
        self.name = f"sw{secrets.token_hex(4)}"
        self.host_veth = f"{self.name}h"
        self.host_address = ""
        self.address = ""
        self._created = False

    def __enter__(self) -> Netns:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> Netns:
        block = _free_block()
        self.host_address, self.address = str(block.network_address + 1), str(block.network_address + 2)
        peer, ns = f"{self.name}c", self.name
        try:
            _ip("netns", "add", ns)
            self._created = True
            _ip("link", "add", self.host_veth, "type", "veth", "peer", "name", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _no_link_local(self.host_veth)
            _no_link_local("eth0", ns)
            _ip("-n", ns, "addr", "add", f"{self.address}/30", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("addr", "add", f"{self.host_address}/30", "dev", self.host_veth)
            _ip("link", "set", self.host_veth, "up")
        except BaseException:
            self.close()
            raise
        return self

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def pids(self) -> list[int]:
        if not self._created:
            return []
        with contextlib.suppress(RuntimeError):
            return [int(pid) for pid in _ip("netns", "pids", self.name).split()]
        return []

    def close(self) -> None:
        """Kill what still runs inside (only our engines), delete the veth pair and the namespace."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["ip", "link", "del", self.host_veth], capture_output=True)
        if self._created:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
            self._created = False


# ---------------------------------------------------------------------------------------------------------------
# containers


_C = TypeVar("_C", bound="_Container")


class _Container:
    """One engine behind a cri-shim, in its cgroup and (optionally) its own network namespace.

    Subclasses say where the log goes, in which format, and under which cgroup path; this class starts and
    stops the shim and the engine, and owns the teardown."""

    own_mounts = True  # a mount namespace of its own (a container's); a systemd service shares the node's

    def __init__(self, tmp: Path, engine: str, transcript: str, *, final: str, tp: int, port: int, host: str,
                 netns: bool, line_delay: float, load_http: str, work: dict | None = None) -> None:
        if engine not in ENGINE_COMMANDS:
            raise ValueError(f"unknown engine {engine!r}; known: {sorted(ENGINE_COMMANDS)}")
        self.tmp = Path(tmp)
        self.rootfs = self.tmp / "root"
        self.engine, self.port, self.host, self.tp = engine, port, host, tp
        self._work = self.tmp / "sandbox" / secrets.token_hex(4)  # scenario, command, pidfile, shim stderr
        self._work.mkdir(parents=True)
        self._netns: Netns | None = Netns().create() if netns else None
        self._shim: subprocess.Popen | None = None
        self._cgroup: Cgroup | None = None
        self._pid = 0
        self._runs = 0
        # `work`: the engine's own view once serving (`/metrics`, stats lines; see tests/sim/pkgs/enginesim.py)
        self._options = {"line_delay": line_delay, "load_http": load_http, **({"work": work} if work else {})}
        self._first = (transcript, final)

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The engine's main pid (the shim's child)."""
        return self._pid

    @property
    def shim_pid(self) -> int:
        return self._shim.pid if self._shim else 0

    @property
    def address(self) -> str:
        """Where the engine's port is reached from our namespace: the pod/container IP, else loopback."""
        return self._netns.address if self._netns else "127.0.0.1"

    @property
    def netns(self) -> Netns | None:
        return self._netns

    @property
    def cgroup(self) -> Cgroup | None:
        return self._cgroup

    @property
    def shim_log(self) -> Path:
        return self._work / "shim.stderr"

    def engine_argv(self) -> list[str]:
        """The engine's own command line, as harness.Engine builds it plus --host."""
        return [*ENGINE_COMMANDS[self.engine], "--host", self.host, "--port", str(self.port), "--tp", str(self.tp)]

    def _scenario(self, transcript: str, final: str) -> Path:
        """The same scenario file harness.Engine writes (see tests/sim/pkgs/enginesim.py)."""
        self._runs += 1
        transcript_path = self._work / f"run{self._runs}.transcript"
        transcript_path.write_text(transcript)
        scenario = self._work / f"run{self._runs}.json"
        scenario.write_text(json.dumps({"transcript": str(transcript_path), "final": final,
                                        "burn_child_seconds": 0.0, **self._options}))
        return scenario

    def _start(self, transcript: str, final: str, cgroup_path: str, shim_args: Sequence[str], ident: str) -> None:
        """Create the cgroup, start the shim (outside it), wait until the engine has exec'd inside it."""
        scenario = self._scenario(transcript, final)
        command_file = self._work / f"run{self._runs}.command"
        # A container has a mount namespace of its own (runc always makes one; `ip netns exec` makes one too).
        prefix = self._netns.exec_prefix() if self._netns else ["unshare", "--mount"] if self.own_mounts else []
        command_file.write_text(json.dumps([*prefix, *self.engine_argv()]))
        pidfile = self._work / f"run{self._runs}.pid"
        self._cgroup = Cgroup(cgroup_path).create()
        cmd = [sys.executable, str(SHIM), "--id", ident, *shim_args, "--pidfile", str(pidfile),
               "--command-file", str(command_file)]
        for procs in self._cgroup.procs_files:
            cmd += ["--cgroup-procs", str(procs)]
        env = dict(os.environ, ENGINESIM_SCENARIO=str(scenario),
                   PYTHONPATH=f"{SIM_PKGS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        with open(self.shim_log, "ab") as stderr:
            self._shim = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=stderr, start_new_session=True)
        self._pid = poll(lambda: self._engine_pid(pidfile), timeout=20, what=f"{self.engine} to start")

    def _engine_pid(self, pidfile: Path) -> int:
        """The child's pid once it runs the engine itself (not `ip netns exec`, not `env`) — its netns is set."""
        assert self._shim is not None
        if self._shim.poll() is not None:
            raise RuntimeError(f"cri-shim exited {self._shim.returncode}: {self.shim_log.read_text()}")
        pid = int(pidfile.read_text())
        return pid if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python") else 0

    def _stop_run(self) -> None:
        """Stop the engine as a runtime does (SIGTERM through the shim, then SIGKILL); drop its cgroup."""
        shim, self._shim = self._shim, None
        if shim is not None and shim.poll() is None:
            shim.send_signal(signal.SIGTERM)
            try:
                shim.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(shim.pid, signal.SIGKILL)
                shim.wait()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            cgroup.kill()
            cgroup.remove()

    def stop(self) -> None:
        """Tear everything down: engine, shim, cgroup, network namespace. Safe to call twice."""
        try:
            self._stop_run()
        finally:
            if self._netns is not None:
                self._netns.close()

    def _guarded(self, start: Callable[[], None]) -> None:
        """Run a start step; on any failure tear down what exists, then re-raise."""
        try:
            start()
        except BaseException:
            self.stop()
            raise


def _new_id() -> str:
    return secrets.token_hex(32)


def _symlink_name(pod: str, namespace: str, container: str, container_id: str) -> str:
    """kubelet legacyLogSymlink: `<pod>_<ns>_<container>-<id>`, cut to 251 characters, + `.log`."""
    return f"{pod}_{namespace}_{container}-{container_id}"[:MAX_LOG_NAME] + ".log"


def _gzip(path: Path) -> None:
    """kubelet compressLog: write `<log>.tmp`, rename to `<log>.gz`, remove the original."""
    tmp = path.with_name(path.name + ".tmp")
    with open(path, "rb") as src, gzip.open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    tmp.rename(path.with_name(path.name + ".gz"))
    path.unlink()


class Pod(_Container):
    """A simulated engine run as a Kubernetes container by containerd (fmt "cri") or CRI-O (fmt "crio").

    Node layout under `<tmp>/root` (kubernetes/kubernetes pkg/kubelet/kuberuntime/helpers.go, legacy.go):
    `/var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log` and the symlink
    `/var/log/containers/<pod>_<ns>_<container>-<cid>.log` -> that absolute node path (dangling on the host,
    as seen from a container with the node's root at --path.rootfs)."""

    def __init__(self, tmp: Path, engine: str, transcript: str, *, namespace: str = "default",
                 pod: str | None = None, container: str | None = None, final: str = "stall", tp: int = 8,
                 port: int = 30000, host: str = "0.0.0.0", netns: bool = True, fmt: str = "cri",
                 qos: str = "burstable", cgroup_driver: str = "systemd", max_line: int = 16384,
                 line_delay: float = 0.0, load_http: str = "refuse", work: dict | None = None) -> None:
        if fmt not in ("cri", "crio"):
            raise ValueError(f"Pod fmt must be cri or crio, not {fmt!r}")
        super().__init__(tmp, engine, transcript, final=final, tp=tp, port=port, host=host, netns=netns,
                         line_delay=line_delay, load_http=load_http, work=work)
        self.namespace = namespace
        self.pod = pod or f"{engine}-{secrets.token_hex(3)}"
        self.container = container or engine
        self.fmt, self.qos, self.cgroup_driver, self.max_line = fmt, qos, cgroup_driver, max_line
        self.pod_uid = str(uuid.uuid4())
        self.restart_count = 0
        self.container_id = ""
        self._symlinks: list[Path] = []
        self._guarded(lambda: self._start_container(*self._first))

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def pod_log_dir_node(self) -> str:
        return f"/var/log/pods/{self.namespace}_{self.pod}_{self.pod_uid}"

    @property
    def log_node_path(self) -> str:
        """The live log as the node sees it: /var/log/pods/<ns>_<pod>_<uid>/<container>/<restart>.log."""
        return f"{self.pod_log_dir_node}/{self.container}/{self.restart_count}.log"

    @property
    def log_path(self) -> Path:
        return self.rootfs / self.log_node_path.lstrip("/")

    @property
    def symlink_path(self) -> Path:
        name = _symlink_name(self.pod, self.namespace, self.container, self.container_id)
        return self.rootfs / "var/log/containers" / name

    @property
    def cgroup_path(self) -> str:
        runtime = "crio" if self.fmt == "crio" else "cri-containerd"
        build = kubepods_systemd if self.cgroup_driver == "systemd" else kubepods_cgroupfs
        return build(self.qos, self.pod_uid, self.container_id, runtime)

    def _start_container(self, transcript: str, final: str) -> None:
        """CRI CreateContainer + StartContainer: a fresh container ID each time, then kubelet's symlink."""
        self.container_id = _new_id()
        self.log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        shim_args = ["--format", self.fmt, "--log", str(self.log_path), "--max-line", str(self.max_line)]
        self._start(transcript, final, self.cgroup_path, shim_args, self.container_id)
        self._link()

    def _link(self) -> None:
        """kubelet startContainer symlinks the log; container GC (MaxPerPodContainer=1) later removes the
        symlink of all but the last dead container."""
        link = self.symlink_path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(self.log_node_path)
        self._symlinks.append(link)
        while len(self._symlinks) > 2:
            self._symlinks.pop(0).unlink(missing_ok=True)

    def rotate(self, when: float | None = None, max_files: int = 5) -> Path:
        """kubelet container log rotation (pkg/kubelet/logs/container_log_manager.go rotateLog): drop excess
        rotated files, gzip the older ones, rename the live log to `<n>.log.<YYYYMMDD-HHMMSS>` (kubelet's
        clock, `when`), then ReopenContainerLog (SIGUSR1 to the shim). Returns the rotated file.
        As with the kubelet, a second rotation within the same second overwrites the first: pass `when`."""
        live = self.log_path
        rotated = sorted(p for p in live.parent.glob(live.name + ".*") if not p.name.endswith(".tmp"))
        excess = max(0, len(rotated) - max(max_files - 2, 0))
        for old in rotated[:excess]:
            old.unlink()
        for old in rotated[excess:]:
            if old.suffix != ".gz":
                _gzip(old)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if when is None else when))
        target = live.with_name(f"{live.name}.{stamp}")
        live.rename(target)
        assert self._shim is not None, "the container is not running"
        self._shim.send_signal(signal.SIGUSR1)
        poll(live.exists, timeout=STOP_SECONDS, what=f"the runtime to reopen {live}")
        return target

    def restart(self, transcript: str, final: str = "stall") -> None:
        """The container restarts: the engine is stopped, a new container (new ID, `<n+1>.log`, a new scope
        in the same pod cgroup, a new symlink) runs `transcript`. The pod's network namespace stays."""
        self._stop_run()
        self.restart_count += 1
        self._guarded(lambda: self._start_container(transcript, final))


class DockerContainer(_Container):
    """A simulated engine in a Docker container: `<tmp>/root/var/lib/docker/containers/<id>/` with
    `<id>-json.log` (json-file), `config.v2.json`, `hostconfig.json` (moby/moby daemon/container/container.go),
    cgroup `system.slice/docker-<id>.scope`. Drivers other than json-file write nothing readable:
    `local` writes its binary format to `local-logs/container.log`, the others nothing."""

    def __init__(self, tmp: Path, engine: str, transcript: str, *, name: str | None = None,
                 final: str = "stall", tp: int = 8, port: int = 30000, host: str = "0.0.0.0", netns: bool = True,
                 driver: str = "json-file", cgroup_driver: str = "systemd", line_delay: float = 0.0,
                 load_http: str = "refuse") -> None:
        super().__init__(tmp, engine, transcript, final=final, tp=tp, port=port, host=host, netns=netns,
                         line_delay=line_delay, load_http=load_http)
        self.container_id = _new_id()
        self.name = name or f"{engine}-{secrets.token_hex(3)}"
        self.driver, self.cgroup_driver = driver, cgroup_driver
        self.restart_count = 0
        self.directory = self.rootfs / "var/lib/docker/containers" / self.container_id
        self._guarded(lambda: self._run_container(*self._first))

    @property
    def log_node_path(self) -> str | None:
        base = f"/var/lib/docker/containers/{self.container_id}"
        if self.driver == "json-file":
            return f"{base}/{self.container_id}-json.log"
        return f"{base}/local-logs/container.log" if self.driver == "local" else None

    @property
    def log_path(self) -> Path | None:
        node = self.log_node_path
        return self.rootfs / node.lstrip("/") if node else None

    @property
    def cgroup_path(self) -> str:
        if self.cgroup_driver == "systemd":
            return docker_systemd(self.container_id)
        return docker_cgroupfs(self.container_id)

    def _write_json(self, name: str, value: object) -> None:
        """moby writes its state files atomically (ioutils.AtomicWriteFile), mode 0600."""
        tmp = self.directory / f".{name}.tmp"
        tmp.write_text(json.dumps(value))
        tmp.chmod(0o600)
        tmp.rename(self.directory / name)

    def _run_container(self, transcript: str, final: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o710)
        network = "bridge" if self._netns else "host"
        self._write_json("hostconfig.json", {"LogConfig": {"Type": self.driver, "Config": {}},
                                             "NetworkMode": network})
        fmt = {"json-file": "docker", "local": "local"}.get(self.driver, "discard")
        shim_args = ["--format", fmt] + (["--log", str(self.log_path)] if self.log_path else [])
        self._start(transcript, final, self.cgroup_path, shim_args, self.container_id)
        self._write_json("config.v2.json", self._config(network))

    def _config(self, network: str) -> dict:
        settings = {"IPAddress": self.address, "IPPrefixLen": 30, "Gateway": self._netns.host_address} \
            if self._netns else {"IPAddress": ""}
        return {
            "ID": self.container_id, "Name": f"/{self.name}", "RestartCount": self.restart_count,
            "LogPath": self.log_node_path if self.driver == "json-file" else "",
            "State": {"Running": True, "Pid": self.pid, "StartedAt": _rfc3339(time.time_ns())},
            "Config": {"Cmd": self.engine_argv()},
            "NetworkSettings": {"Networks": {network: settings}},
        }

    def restart(self, transcript: str, final: str = "stall") -> None:
        """`docker restart`: same ID, same log file (appended), same cgroup path, a new engine process."""
        self._stop_run()
        self.restart_count += 1
        self._guarded(lambda: self._run_container(transcript, final))


def _rfc3339(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}".rstrip("0").rstrip(".") + "Z"


class SystemdUnit(_Container):
    """A simulated engine as a systemd service: cgroup `system.slice/<unit>`, the host's network, stdout and
    stderr on one stream socket read by the journald stand-in (`cri-shim --format journal`), which appends
    `journalctl -o json` entries to `journal` (what a fake `journalctl` reads via STALLWATCH_FAKE_JOURNAL)."""

    own_mounts = False

    def __init__(self, tmp: Path, engine: str, transcript: str, *, unit: str | None = None,
                 final: str = "stall", tp: int = 8, port: int = 30000, host: str = "127.0.0.1",
                 journal: Path | None = None, line_delay: float = 0.0, load_http: str = "refuse") -> None:
        super().__init__(tmp, engine, transcript, final=final, tp=tp, port=port, host=host, netns=False,
                         line_delay=line_delay, load_http=load_http)
        self.unit = unit or f"{engine}-{secrets.token_hex(3)}.service"
        self.journal = Path(journal) if journal else self.tmp / "journal.json"
        self._guarded(lambda: self._run_unit(*self._first))

    @property
    def name(self) -> str:
        return self.unit

    @property
    def cgroup_path(self) -> str:
        return systemd_unit(self.unit)

    @property
    def env(self) -> dict[str, str]:
        """What the exporter under test needs to find this journal."""
        return {"STALLWATCH_FAKE_JOURNAL": str(self.journal)}

    def journal_entries(self) -> list[dict]:
        """The entries so far, parsed; a line still being written is skipped."""
        entries = []
        for line in self.journal.read_text().splitlines() if self.journal.exists() else ():
            with contextlib.suppress(ValueError):
                entries.append(json.loads(line))
        return entries

    def _run_unit(self, transcript: str, final: str) -> None:
        shim_args = ["--format", "journal", "--unit", self.unit, "--log", str(self.journal)]
        self._start(transcript, final, self.cgroup_path, shim_args, self.unit)

    def restart(self, transcript: str, final: str = "stall") -> None:
        """`systemctl restart`: same unit and cgroup, a new main pid and stream; the journal keeps growing."""
        self._stop_run()
        self._guarded(lambda: self._run_unit(transcript, final))


def read_cri(path: Path) -> list[tuple[str, str, str, str]]:
    """Parse a CRI log file into (time, stream, tag, content) records (kubelet parseCRILog: 4 fields)."""
    records = []
    for line in path.read_bytes().decode("utf-8", "replace").split("\n")[:-1]:
        time_, stream, tag, content = line.split(" ", 3)
        records.append((time_, stream, tag, content))
    return records


def join_cri(records: Iterable[tuple[str, str, str, str]], stream: str = "stdout") -> list[str]:
    """Full lines of one stream: P contents are concatenated until an F arrives."""
    lines, partial = [], ""
    for _time, name, tag, content in records:
        if name != stream:
            continue
        partial += content
        if tag.split(":")[0] == "F":
            lines.append(partial)
            partial = ""
    return lines
