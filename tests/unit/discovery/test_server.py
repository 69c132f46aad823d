"""A server's `look()`: one frozen value of what a scrape or a report reads, and the one place where what readers
move moves (the CPU ledger and the most rank processes a launch has had)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import psutil
import pytest

from stallwatch.config import Config, Paths, ServerSpec
from stallwatch.discovery.processes import ProcSample
from stallwatch.discovery.server import Look, Server
from stallwatch.discovery.workload import Workload
from support.looks import proc
from support.watchers import candidate

SGLANG = ("python3", "-m", "sglang.launch_server", "--model-path", "m", "--port", "30000")


def _server(tmp_path: Path) -> Server:
    config = Config(paths=Paths(procfs=str(tmp_path)))  # no /proc/PID files: no environ, no sockets read
    return Server("sglang-30000", ServerSpec(engine="sglang"), config)


def _attached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trees: list[list[ProcSample]]) -> Server:
    """A server attached to this test's own process (alive, and no process started), whose successive tree reads
    give `trees` (the last one from then on)."""
    server = _server(tmp_path)
    assert server.attach(candidate(os.getpid(), SGLANG), Workload(), os.getuid())
    reads = iter(trees)
    last: list[list[ProcSample]] = [trees[-1]]

    def read_tree(launch: object) -> list[ProcSample]:
        last[0] = next(reads, last[0])
        return server.launch.ledger.cap(last[0])

    monkeypatch.setattr(server, "_read_tree", read_tree)
    monkeypatch.setattr("stallwatch.discovery.server.TREE_CACHE_SECONDS", 0.0)  # each look reads the tree anew
    return server


def _ranks(count: int, cpu: float = 1.0) -> list[ProcSample]:
    return [proc(os.getpid(), psutil.Process().create_time(), cpu=cpu),
            *(proc(1000 + rank, 5.0, f"scheduler_TP{rank}", cpu=cpu) for rank in range(count))]


def test_a_server_without_its_process_is_seen_down_with_nothing_counted(tmp_path: Path) -> None:
    """Before its process is found: down, no tree, no CPU, no ranks, and the log's reading of a fresh interpreter."""
    look = _server(tmp_path).look()
    assert (look.running, look.tree, look.cpu, look.ranks) == (False, (), {}, None)
    assert look.log.phase == "stopped" and look.launch.pid is None


def test_a_look_is_a_frozen_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader holds what it saw: a look cannot be changed, and a later look does not change an earlier one."""
    server = _attached(tmp_path, monkeypatch, [_ranks(2), _ranks(1)])
    first = server.look()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.running = False  # type: ignore[misc]
    second = server.look()
    assert isinstance(first, Look) and len(first.tree) == 3 and len(second.tree) == 2


def test_ranks_keep_the_most_the_launch_had(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that lost one of its 8 scheduler ranks: the look says 7 live of the 8 the launch had, and a new launch
    counts from nothing again."""
    server = _attached(tmp_path, monkeypatch, [_ranks(8), _ranks(7), _ranks(7)])
    assert server.look().ranks == (8, 8)
    assert server.look().ranks == (7, 8)
    assert server.look().ranks == (7, 8)


def test_cpu_by_role_never_goes_down_as_processes_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU of a rank that exits stays counted under its role: the per-role totals of successive looks only
    grow, and a look that finds the same tree counts nothing twice."""
    server = _attached(tmp_path, monkeypatch, [_ranks(2, cpu=3.0), _ranks(2, cpu=3.0), _ranks(1, cpu=4.5)])
    first, second, third = server.look(), server.look(), server.look()
    assert first.cpu == second.cpu
    assert sum(first.cpu["scheduler_TP1"]) == pytest.approx(3.0)
    assert sum(third.cpu["scheduler_TP1"]) == pytest.approx(3.0)  # gone, and kept
    assert sum(third.cpu["scheduler_TP0"]) == pytest.approx(4.5)
    assert all(third.cpu[role][i] >= first.cpu[role][i] for role in first.cpu for i in (0, 1))


def test_the_log_in_a_look_is_the_interpreters_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the log said is taken with the rest, at the same moment."""
    server = _attached(tmp_path, monkeypatch, [_ranks(1)])
    server.interpreter.feed(b"[2026-11-20 09:14:13] Load weight begin. avail mem=78.54 GB\n")
    assert server.look().log == server.interpreter.snapshot()
    assert server.look().log.phase == "loading_weights"


def test_a_process_that_retitles_itself_keeps_the_flags_it_was_found_with(tmp_path: Path) -> None:
    """SGLang's router sets its title (`sglang::router`) once started: its argv then reads as the title and the NULs
    of the rest of its argv area, and its port and its members are those of its first command line."""
    config = Config(paths=Paths(procfs=str(tmp_path)))
    server = Server("router", ServerSpec(engine="sglang_router"), config)
    flags = ("python3", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill",
             "http://127.0.0.1:30000", "8998", "--decode", "http://127.0.0.1:30001", "--port", "8000")
    assert server.attach(candidate(os.getpid(), flags), Workload(), os.getuid())
    assert server.attach(candidate(os.getpid(), ("sglang::router", "", "", "")), Workload(), os.getuid())
    launch = server.launch
    assert launch.argv == ("sglang::router", "", "", "") and launch.flags == flags and launch.port == 8000
    assert launch.pd is not None
    assert launch.pd.routes == (("prefill", "127.0.0.1", 30000), ("decode", "127.0.0.1", 30001))


TRITON = ("/opt/tritonserver/bin/tritonserver", "--model-repository=/models/repo", "--http-port=8000")


def _proc_entry(procfs: Path, pid: int, ppid: int, environ: bytes) -> None:
    """`/proc/PID/stat` (its parent) and `/proc/PID/environ` of a live process, as the test's procfs says them."""
    (procfs / str(pid)).mkdir(exist_ok=True)
    (procfs / str(pid) / "stat").write_text(f"{pid} (x) S {ppid} 0 0 0\n")
    (procfs / str(pid) / "environ").write_bytes(environ)


@pytest.mark.parametrize("main_rank", [b"OMPI_COMM_WORLD_RANK=0\0", b"HOME=/root\0"])
def test_the_other_ranks_of_its_mpi_launcher_are_part_of_the_server(tmp_path: Path, main_rank: bytes) -> None:
    """Triton's TensorRT-LLM launcher starts one `tritonserver` per rank under mpirun; rank 0 is the server and the
    ranks above 0, its siblings under mpirun, hold their share of the engine's GPU memory and CPU: they are in its tree
    as `rank1` (issue 28). A child of mpirun without a rank (a helper it runs) is not. The counter-test: a tritonserver
    that is no rank (its parent a shell, not a launcher) has no siblings in its tree. Live processes stand in: the
    test's parent as the launcher, this process as rank 0, pid 1 as rank 1, the parent's parent as the helper."""
    launcher, main, helper = os.getppid(), os.getpid(), psutil.Process(os.getppid()).ppid()
    _proc_entry(tmp_path, main, launcher, main_rank + b"OMPI_COMM_WORLD_SIZE=2\0")
    _proc_entry(tmp_path, 1, launcher, b"OMPI_COMM_WORLD_SIZE=2\0OMPI_COMM_WORLD_RANK=1\0")
    _proc_entry(tmp_path, helper, launcher, b"HOME=/root\0")
    server = Server("triton-8000", ServerSpec(engine="triton"), Config(paths=Paths(procfs=str(tmp_path))))
    assert server.attach(dataclasses.replace(candidate(main, TRITON), ppid=launcher), Workload(), os.getuid())
    roles = {s.pid: s.role for s in server.look().tree}
    if main_rank.startswith(b"OMPI"):
        assert roles == {main: "main", 1: "rank1"}
        assert set(server.look().cpu) == {"main", "rank1"}
    else:
        assert roles == {main: "main"}
