"""A file that several servers' processes write: a line is the server's whose process wrote it, where the engine's
prefix names the writer's pid (vLLM), and no server's otherwise (audit 2026-12-02 #6)."""

from __future__ import annotations

from pathlib import Path

from stallwatch.engines.sglang import ENGINE as SGLANG
from stallwatch.engines.vllm import ENGINE as VLLM
from stallwatch.logs.follow import LogFile
from stallwatch.logs.shared import KEPT_PIDS, WriterFilter
from support import transcripts
from support.watchers import log_watcher

# vLLM's own lines (tests/support/transcripts.py, from vllm/logger.py's format), and a coloured one of 0.11.
API = b"(APIServer pid=100) INFO 11-20 09:00:01 [launcher.py:196] Route: /health, Methods: GET\n"
CORE = b"\x1b[1;36m(EngineCore_DP0 pid=101)\x1b[0;0m INFO 11-20 09:00:09 [core.py:140] Initializing\n"
WORKER_V08 = b"(VllmWorker rank=0 pid=102) INFO 04-29 22:59:27 [loader.py:458] Loading weights took 4.1 s\n"
OTHER = b"(APIServer pid=200) ERROR 11-20 09:00:02 [core.py:1] EngineCore failed to start.\n"


def test_a_line_is_the_servers_whose_process_wrote_it() -> None:
    own = WriterFilter(VLLM.line_pid, lambda: [100, 101, 102])
    assert own(API + OTHER + CORE + b"no prefix at all\n" + WORKER_V08) == API + CORE + WORKER_V08


def test_a_process_that_left_the_tree_keeps_its_lines_and_the_memory_is_bounded() -> None:
    tree = [100]
    own = WriterFilter(VLLM.line_pid, lambda: tree)
    assert own(API) == API
    tree = list(range(1000, 1000 + KEPT_PIDS))  # the APIServer exited (its last lines come after), and many others
    assert own(API) == b""  # pushed out: at most KEPT_PIDS remembered
    tree = [100]
    own(b"")
    tree = []
    assert own(API) == API  # gone from the tree, its last lines still its


def test_an_engine_whose_lines_name_no_pid_attributes_none() -> None:
    assert WriterFilter(SGLANG.line_pid, lambda: [100])(b"[2026-11-20 09:14:02 TP0] Load weight begin.\n") == b""


def test_a_shared_vllm_file_gives_each_server_its_own_lines(tmp_path: Path) -> None:
    shared = tmp_path / "shared.log"
    shared.write_bytes(b"")
    watcher = log_watcher({"a": [shared], "b": [shared]}, engine="vllm")
    followers = {}
    for server, pids in zip(watcher.servers(), ([525681, 525790], [7]), strict=True):
        followers[server.name] = LogFile(server.name, server.launch.log_sources[0], server.interpreter,
                                         recover=False, writers=WriterFilter(VLLM.line_pid, lambda pids=pids: pids))
    followers["a"].share(frozenset({"b"}))
    followers["b"].share(frozenset({"a"}))
    for f in followers.values():
        f.poll()
    shared.write_bytes(transcripts.vllm_healthy(tp=1).encode())  # a's processes: pids 525681 and 525790
    for f in followers.values():
        f.poll()
    phases = {name: s.interpreter.snapshot().phase for name, s in zip("ab", watcher.servers(), strict=True)}
    assert phases["a"] not in ("stopped", "launching") and phases["b"] == "stopped", phases
    assert followers["a"].stats().shared and followers["a"].stats().lines == followers["b"].stats().lines
