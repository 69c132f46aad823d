"""The watcher's names for servers: two on one port get two names; a configured one is never forgotten."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from stallwatch.config import Discovery, ServerSpec
from stallwatch.discovery.processes import Candidate
from stallwatch.discovery.server import Server
from stallwatch.discovery.watcher import Watcher
from support.clock import Clock
from support.watchers import candidate, watcher


def test_two_live_servers_on_one_port_get_two_names(tmp_path: Path) -> None:
    w = watcher(tmp_path, [candidate(os.getppid()), candidate(os.getpid())])
    w.refresh()
    assert sorted(s.name for s in w.servers()) == ["sglang-30000", "sglang-30000-2"]
    assert {s.launch.pid for s in w.servers()} == {os.getppid(), os.getpid()}


def test_a_configured_server_is_never_forgotten(tmp_path: Path) -> None:
    clock = Clock()
    spec = ServerSpec(engine="sglang", name="kimi")
    w = watcher(tmp_path, [], clock, servers=(spec,), discovery=Discovery(enabled=False, forget_after=1.0))
    w.refresh()
    clock.now += 3600
    w.refresh()
    assert [s.name for s in w.servers()] == ["kimi"] and not w.servers()[0].is_running()


WRAPPERS = [
    ("gdb", "--args", "/opt/llama.cpp/build/bin/llama-server", "-m", "m.gguf", "--port", "8081"),
    ("strace", "-f", "-o", "/tmp/trace", "/opt/llama.cpp/build/bin/llama-server", "--port", "8081"),
    ("perf", "record", "-g", "--", "llama-server", "--port", "8081"),
    ("valgrind", "--tool=memcheck", "llama-server"),
    ("vim", "/opt/llama.cpp/build/bin/llama-server"),
    ("python3", "launch.py", "--server", "/opt/llama.cpp/build/bin/llama-server"),
    ("bash", "-c", "exec python3 -m vllm.entrypoints.openai.api_server --port 8001"),
    ("tmux", "new", "-d", "vllm serve m"),
]


@pytest.mark.parametrize("argv", WRAPPERS, ids=[w[0] for w in WRAPPERS])
def test_a_tool_given_a_servers_path_is_not_discovered(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """A debugger, tracer, profiler, editor, launcher or shell whose arguments name an engine's binary or module runs
    itself: discovered, it would read as a server on a port it never opens and fire InferenceServerDown when the
    tool exits (issue 27 item 3)."""
    w = watcher(tmp_path, [candidate(os.getpid(), argv)])
    w.refresh()
    assert w.servers() == []


def test_the_server_a_launcher_starts_is_discovered_not_the_launcher(tmp_path: Path) -> None:
    """A launcher given the path forks the real server: the server, its child, is the root discovered (the launcher
    used to match and hide its child as a forked worker of itself)."""
    launcher = candidate(os.getppid(), ("gdb", "--args", "/opt/bin/llama-server", "--port", "8081"))
    server = candidate(os.getpid(), ("/opt/bin/llama-server", "--port", "8081"))
    w = watcher(tmp_path, [launcher, dataclasses.replace(server, ppid=launcher.pid)])
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("llamacpp-8081", os.getpid())]


OLLAMA = ("/usr/local/bin/ollama", "serve")
RUNNERS = [
    ("/usr/local/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/sha256-6a07", "--port", "40123",
     "--host", "127.0.0.1", "--no-webui", "--offline", "-c", "4096", "-np", "1"),
    ("/usr/local/bin/ollama", "runner", "--ollama-engine", "--model", "/root/.ollama/models/blobs/sha256-6a07",
     "--port", "40123"),
]


@pytest.mark.parametrize("argv", RUNNERS, ids=["llama-server", "ollama-runner"])
def test_an_ollama_runner_is_part_of_ollama_not_a_server(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """Ollama starts a runner per model load and ends it after its keep-alive: discovered on its own, each load
    would be a new llama.cpp server named after a random port, and each unload InferenceServerDown (issue 28)."""
    ollama = candidate(os.getppid(), OLLAMA)
    runner = dataclasses.replace(candidate(os.getpid(), argv), ppid=ollama.pid)
    w = watcher(tmp_path, [ollama, runner])
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("ollama-11434", os.getppid())]


def test_a_server_anywhere_in_a_watched_servers_tree_is_part_of_it(tmp_path: Path) -> None:
    """The rule is the tree's, not Ollama's: a llama-server below a vLLM server through a shell that matches no
    engine is still inside it, and one beside it is a server of its own."""
    vllm = candidate(os.getppid(), ("vllm", "serve", "m", "--port", "8001"))
    shell = Candidate(2**22 + 7, vllm.pid, vllm.create_time, ("sh", "-c", "llama-server"), "sh -c llama-server")
    inside = dataclasses.replace(candidate(os.getpid(), ("llama-server", "--port", "8081")), ppid=shell.pid)
    w = watcher(tmp_path, [vllm, shell, inside])
    w.refresh()
    assert [s.name for s in w.servers()] == ["vllm-8001"]
    beside = dataclasses.replace(inside, ppid=1)
    w = watcher(tmp_path, [vllm, shell, beside])
    w.refresh()
    assert sorted(s.name for s in w.servers()) == ["llamacpp-8081", "vllm-8001"]


def test_a_server_inside_a_configured_servers_tree_is_not_discovered(tmp_path: Path) -> None:
    """A configured server matched by its launcher's command line watches the tree below it: the engine it starts is
    part of it."""
    launcher = candidate(os.getppid(), ("/opt/models/run.sh", "qwen"))
    server = dataclasses.replace(candidate(os.getpid(), ("llama-server", "--port", "8081")), ppid=launcher.pid)
    spec = ServerSpec(engine="llamacpp", name="qwen", cmdline=re.compile(r"run\.sh qwen"))
    w = watcher(tmp_path, [launcher, server], servers=(spec,))
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("qwen", os.getppid())]


def test_ollamas_address_is_read_from_its_environment(tmp_path: Path) -> None:
    """`OLLAMA_HOST` moves Ollama's port (it has no flag for it): the name, the port and the probe follow it."""
    ollama = candidate(os.getpid(), OLLAMA)
    (tmp_path / str(ollama.pid)).mkdir()
    (tmp_path / str(ollama.pid) / "environ").write_bytes(b"HOME=/usr/share/ollama\0OLLAMA_HOST=0.0.0.0:8000\0")
    w = watcher(tmp_path, [ollama])
    w.refresh()
    [server] = w.servers()
    assert (server.name, server.launch.port) == ("ollama-8000", 8000)
    assert [t.probe.url for t in server.launch.probes] == ["http://127.0.0.1:8000/"]


def test_a_tritonserver_rank_above_0_under_mpirun_is_no_server_of_its_own(tmp_path: Path) -> None:
    """TensorRT-LLM's Triton launcher runs one `tritonserver` per rank under mpirun, each given rank 0's ports: only
    rank 0 serves (issue 28). Rank 1 (`OMPI_COMM_WORLD_RANK=1` in its environment) is found as no second server; the
    counter-test: rank 0, and a tritonserver with no rank at all, are servers."""
    argv = ("/opt/tritonserver/bin/tritonserver", "--model-repository=/models/repo", "--http-port=8000")
    mpirun = candidate(1, ("mpirun", "--allow-run-as-root", "-n", "1", *argv, ":", "-n", "1", *argv))
    ranks = [dataclasses.replace(candidate(pid, argv), ppid=mpirun.pid) for pid in (os.getppid(), os.getpid())]
    for rank, process in enumerate(ranks):
        (tmp_path / str(process.pid)).mkdir()
        (tmp_path / str(process.pid) / "environ").write_bytes(
            f"OMPI_COMM_WORLD_SIZE=2\0OMPI_COMM_WORLD_RANK={rank}\0".encode())
    w = watcher(tmp_path, [mpirun, *ranks])
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("triton-8000", os.getppid())]
    (tmp_path / str(os.getpid()) / "environ").write_bytes(b"HOME=/root\0")
    w = watcher(tmp_path, [mpirun, ranks[1]])
    w.refresh()
    assert [(s.name, s.launch.pid) for s in w.servers()] == [("triton-8000", os.getpid())]


NEIGHBOUR, REAL, OTHER = 1, os.getppid(), os.getpid()  # live processes, oldest first: pid 1 plays the neighbour's
REAL_SERVER = ServerSpec(engine="sglang", name="real", cmdline=re.compile(r"sglang\.launch_server"))


def _configured(tmp_path: Path, found: list[Candidate], gpu: set[int], **spec: object) -> Watcher:
    """A watcher of one configured server `real` (no discovery) over `found`, the neighbour's process of uid 1001,
    the others root's; `gpu`: the pids holding GPU memory, which the test may change between passes."""
    return watcher(tmp_path, found, owners={NEIGHBOUR: 1001, REAL: 0, OTHER: 0}, gpu_pids=lambda: set(gpu),
                   servers=(dataclasses.replace(REAL_SERVER, **spec),), discovery=Discovery(enabled=False))


def _root(pid: int) -> Candidate:
    return dataclasses.replace(candidate(pid), ppid=0)  # none the child of another


def _main(w: Watcher) -> int | None:
    w.refresh()
    [server] = w.servers()
    return server.launch.pid


def test_a_configured_server_is_its_gpu_holders_uids_not_a_neighbours_older_copy(tmp_path: Path) -> None:
    """Audit 2026-12-02 #5: another user's copy of the server's argv, started first, is followed only until a match
    holds GPU memory; from then on only that uid's process is the server's, so the copy never comes back while the
    server is down (InferenceServerDown) nor counts a launch (tests/root/test_discovery.py, with real processes)."""
    found, gpu = [_root(NEIGHBOUR), _root(REAL)], set()
    w = _configured(tmp_path, found, gpu)
    assert _main(w) == NEIGHBOUR  # nothing holds GPU memory yet: the first match
    gpu.add(REAL)
    assert _main(w) == REAL
    gpu.clear()
    found.remove(found[1])  # the real server's process is no match any more (gone, or relaunching)
    assert _main(w) == REAL  # not the neighbour's: still the real one's launch, which reads down once it ends
    found.append(_root(OTHER))  # root's relaunch is accepted
    assert _main(w) == OTHER


@pytest.mark.parametrize(("user", "main"), [(0, REAL), (1001, NEIGHBOUR)])
def test_a_configured_user_says_whose_process_the_server_is(tmp_path: Path, user: int, main: int) -> None:
    """`match.user`: from the first pass, whoever holds GPU memory."""
    w = _configured(tmp_path, [_root(NEIGHBOUR), _root(REAL)], {NEIGHBOUR, REAL}, user=user)
    assert _main(w) == main
    assert _main(w) == main


def test_the_process_followed_stays_while_it_lives(tmp_path: Path) -> None:
    """An older match of the same user (a second copy, a tool with the same argv) never replaces the live main."""
    found = [_root(OTHER)]
    w = _configured(tmp_path, found, {OTHER})
    assert _main(w) == OTHER
    found.insert(0, _root(REAL))
    assert _main(w) == OTHER


def _port(port: int) -> tuple[str, ...]:
    return ("python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", str(port))


def _unit(tmp_path: Path, pid: int, unit: str) -> None:
    """Process `pid` in systemd unit `unit`, as its cgroup file under the test's procfs says."""
    (tmp_path / str(pid)).mkdir(exist_ok=True)
    (tmp_path / str(pid) / "cgroup").write_text(f"0::/system.slice/{unit}\n")


def test_the_per_owner_cap_counts_per_workload_and_a_host_process_per_uid(tmp_path: Path) -> None:
    """Audit 2026-12-02 #10: the cap per uid made every root container and unit one tenant. A unit's server is its
    unit's, beside a host process of root's that fills root's share; two host processes of root's share one."""
    found = [candidate(os.getppid(), _port(30001)), candidate(os.getpid(), _port(30002))]
    _unit(tmp_path, os.getpid(), "sglang-real.service")
    w = watcher(tmp_path, found, discovery=Discovery(enabled=True, max_servers_per_user=1))
    w.refresh()
    assert sorted(s.name for s in w.servers()) == ["sglang-30001", "sglang-real.service"] and w.skipped == 0
    w = watcher(tmp_path / "none", found, discovery=Discovery(enabled=True, max_servers_per_user=1))
    w.refresh()
    assert [s.name for s in w.servers()] == ["sglang-30001"] and w.skipped == 1


def test_a_gone_servers_slot_is_free(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit 2026-12-02 #10: gone servers kept their slots for `forget_after`. Only running servers count, and the
    one gone longest is forgotten when a new server needs its entry."""
    found = [candidate(os.getppid(), _port(30001))]
    w = watcher(tmp_path, found, discovery=Discovery(enabled=True, max_servers=1, forget_after=3600.0))
    w.refresh()
    [gone] = w.servers()
    monkeypatch.setattr(gone, "is_running", lambda: False)  # its process ended
    found[:] = [candidate(os.getpid(), _port(30002))]
    w.refresh()
    assert [s.name for s in w.servers()] == ["sglang-30002"] and w.skipped == 0


SQUATTER, ROOTS = os.getppid(), os.getpid()  # the neighbour's process starts first


def _names(w: Watcher) -> dict[str, int | None]:
    w.refresh()
    return {s.name: s.launch.pid for s in w.servers()}


def test_a_neighbour_that_starts_first_holds_a_host_servers_name_only_until_roots_comes(tmp_path: Path) -> None:
    """Audit 2026-12-02 #11: another user's process on the port took `sglang-30500` and root's real server was
    `sglang-30500-2` for good. The plain name is root's; the neighbour's is `@uid1001` from then on."""
    found = [_root(SQUATTER)]
    w = watcher(tmp_path, found, owners={SQUATTER: 1001, ROOTS: 0})
    assert _names(w) == {"sglang-30000": SQUATTER}  # alone: the plain name
    found.append(_root(ROOTS))
    assert _names(w) == {"sglang-30000": ROOTS}
    assert _names(w) == {"sglang-30000": ROOTS, "sglang-30000@uid1001": SQUATTER}
    assert _names(w) == {"sglang-30000": ROOTS, "sglang-30000@uid1001": SQUATTER}


def _gone_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: int, then: int) -> tuple[Watcher, Server]:
    """A watcher that found `first`'s process (pid), which is gone by the next pass, where `then`'s is found."""
    found = [_root(first)]
    w = watcher(tmp_path, found, owners={SQUATTER: 1001, ROOTS: 0})
    w.refresh()
    [gone] = w.servers()
    monkeypatch.setattr(gone, "is_running", lambda: False)
    found[:] = [_root(then)]
    return w, gone

def test_a_gone_neighbours_entry_leaves_the_name_to_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The squatter killed before root's server starts: its gone entry (server_up 0, InferenceServerDown) no longer
    sits on the name operators expect."""
    w, _ = _gone_then(tmp_path, monkeypatch, SQUATTER, ROOTS)
    assert _names(w) == {"sglang-30000": ROOTS}


def test_a_copy_never_takes_a_gone_root_servers_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root's server down: its entry stays under its name (InferenceServerDown), the copy is `@uid1001`."""
    w, real = _gone_then(tmp_path, monkeypatch, ROOTS, SQUATTER)
    assert _names(w) == {"sglang-30000": ROOTS, "sglang-30000@uid1001": SQUATTER}
    assert w.servers()[0] is real
