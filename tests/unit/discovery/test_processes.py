"""The node's process table (`ProcessTable`, read from a procfs tree under tmp_path on a test clock) and a server's
per-role CPU ledger (`CpuLedger`), whose totals never go back as children come, go or rename themselves."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.discovery.processes import (
    MAX_ROLES,
    OTHER_ROLE,
    CpuLedger,
    ProcessTable,
    ProcSample,
    invocation,
    role_name,
)
from stallwatch.engines import ENGINES
from support.clock import Clock


def _proc(procfs: Path, pid: int, ppid: int, comm: str = "python3") -> None:
    """A `/proc/PID/stat` as the kernel writes it: pid, (comm), state, ppid, then the rest."""
    (procfs / str(pid)).mkdir(parents=True, exist_ok=True)
    (procfs / str(pid) / "stat").write_bytes(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0".encode())


def _table(procfs: Path, clock: Clock, max_age: float = 0.5) -> ProcessTable:
    return ProcessTable(str(procfs), max_age, clock=clock)


def test_descendants_lists_children_and_grandchildren_parents_first(tmp_path: Path) -> None:
    """A server's tree is every process below its main one, each parent before its own children."""
    for pid, ppid in [(10, 1), (11, 10), (12, 10), (13, 11), (14, 13), (20, 1), (21, 20)]:
        _proc(tmp_path, pid, ppid)
    found = _table(tmp_path, Clock()).descendants(10)
    assert sorted(found) == [11, 12, 13, 14]
    assert found.index(11) < found.index(13) < found.index(14)
    assert _table(tmp_path, Clock()).descendants(14) == []


def test_a_comm_with_spaces_and_parentheses_does_not_move_the_parent(tmp_path: Path) -> None:
    """A child that names itself `x) S 1 (` still counts under its real parent, not under the pid it wrote."""
    _proc(tmp_path, 10, 1)
    _proc(tmp_path, 11, 10, comm="x) S 1 (y")
    _proc(tmp_path, 12, 10, comm="a b c")
    table = _table(tmp_path, Clock())
    assert sorted(table.descendants(10)) == [11, 12]
    assert table.descendants(11) == [] and table.descendants(1)[0] == 10


def test_unreadable_or_garbled_entries_are_skipped(tmp_path: Path) -> None:
    """A process gone mid-read, a stat that is not one, or a non-pid entry never breaks the table."""
    _proc(tmp_path, 10, 1)
    _proc(tmp_path, 11, 10)
    (tmp_path / "12").mkdir()  # gone: no stat
    (tmp_path / "13").mkdir()
    (tmp_path / "13" / "stat").write_bytes(b"13 (no closing paren S 10")
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "stat").write_bytes(b"14 (short) S")
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_bytes(b"99 (self) S 10 1 1")
    assert _table(tmp_path, Clock()).descendants(10) == [11]


def test_a_missing_procfs_reads_as_no_processes(tmp_path: Path) -> None:
    """No procfs (a bad `paths.procfs`) gives an empty tree, not an exception."""
    assert _table(tmp_path / "absent", Clock()).descendants(1) == []


def test_the_table_is_read_once_per_max_age_for_all_callers(tmp_path: Path) -> None:
    """Within `max_age` every server's tree comes from one read; after it, a new process is seen."""
    clock = Clock(100.0)
    _proc(tmp_path, 10, 1)
    table = _table(tmp_path, clock, max_age=0.5)
    assert table.descendants(10) == []
    _proc(tmp_path, 11, 10)
    clock.now += 0.25
    assert table.descendants(10) == []  # still the read of 0.25 s ago
    clock.now += 0.25
    assert table.descendants(10) == [11]


def _sample(pid: int, role: str, user: float, system: float = 0.0, create_time: float = 1.0) -> ProcSample:
    return ProcSample(pid, create_time, role, "S", user, system, 0, 1)


def test_cpu_of_a_child_that_exits_stays_counted() -> None:
    """A role's total does not drop when one of its processes exits."""
    ledger = CpuLedger()
    assert ledger.update([_sample(1, "main", 5.0, 1.0), _sample(2, "worker", 3.0, 2.0)]) == {
        "main": (5.0, 1.0), "worker": (3.0, 2.0)}
    assert ledger.update([_sample(1, "main", 6.0, 1.0)]) == {"main": (6.0, 1.0), "worker": (3.0, 2.0)}
    assert ledger.update([_sample(1, "main", 6.0, 1.0), _sample(3, "worker", 0.5)])["worker"] == (3.5, 2.0)


def test_a_reused_pid_is_a_new_process() -> None:
    """A pid reused by a new process (another start time) adds its CPU to what the old one used."""
    ledger = CpuLedger()
    ledger.update([_sample(7, "worker", 10.0, create_time=1.0)])
    assert ledger.update([_sample(7, "worker", 1.0, create_time=2.0)]) == {"worker": (11.0, 0.0)}


def test_a_renamed_process_leaves_its_cpu_so_far_with_its_old_role() -> None:
    """After setproctitle the old role keeps what was used under it and the new role counts only what follows."""
    ledger = CpuLedger()
    ledger.update([_sample(7, "python3", 4.0, 1.0)])
    assert ledger.update([_sample(7, "scheduler_TP0", 5.0, 1.5)]) == {
        "python3": (4.0, 1.0), "scheduler_TP0": (1.0, 0.5)}
    assert ledger.update([_sample(7, "scheduler_TP0", 9.0, 2.0)]) == {
        "python3": (4.0, 1.0), "scheduler_TP0": (5.0, 1.0)}
    assert ledger.update([]) == {"python3": (4.0, 1.0), "scheduler_TP0": (5.0, 1.0)}


def test_totals_never_go_back_when_a_counter_reads_lower() -> None:
    """A process whose CPU times read lower than before (a renamed process's base) never lowers a total."""
    ledger = CpuLedger()
    ledger.update([_sample(7, "a", 4.0)])
    ledger.update([_sample(7, "b", 5.0)])
    assert ledger.update([_sample(7, "b", 3.0)]) == {"a": (4.0, 0.0), "b": (0.0, 0.0)}


def test_roles_past_the_cap_share_the_other_role() -> None:
    """Only the first MAX_ROLES roles get series of their own; later ones are `other`, however often they rename."""
    ledger = CpuLedger()
    first = [_sample(i, f"role{i}", 1.0) for i in range(MAX_ROLES)]
    assert [s.role for s in ledger.cap(first)] == [f"role{i}" for i in range(MAX_ROLES)]
    later = ledger.cap([_sample(100, "late", 1.0), _sample(101, "later", 1.0), _sample(0, "role0", 2.0)])
    assert [s.role for s in later] == [OTHER_ROLE, OTHER_ROLE, "role0"]
    assert later[0].cpu_user == 1.0 and later[0].pid == 100  # only the role changes


def test_a_role_keeps_its_place_after_its_processes_exit() -> None:
    """A role given its series keeps it when its processes are gone, so the set grows only to the cap."""
    ledger = CpuLedger()
    ledger.cap([_sample(1, "early", 1.0)])
    ledger.cap([_sample(i, f"role{i}", 1.0) for i in range(2, 2 + MAX_ROLES)])
    assert ledger.roles == {"early"} | {f"role{i}" for i in range(2, 1 + MAX_ROLES)}
    assert [s.role for s in ledger.cap([_sample(1, "early", 2.0)])] == ["early"]


@pytest.mark.parametrize(("argv", "runs"), [
    (["/opt/llama/bin/llama-server", "-m", "m.gguf"], "/opt/llama/bin/llama-server -m m.gguf"),
    (["python3", "-m", "sglang.launch_server", "--port", "1"], "sglang.launch_server --port 1"),
    (["/usr/bin/python3.12", "-u", "-W", "ignore", "-X", "dev", "-m", "vllm.entrypoints.openai.api_server"],
     "vllm.entrypoints.openai.api_server"),
    (["python", "-um", "sglang.launch_server"], "sglang.launch_server"),
    (["python3", "-msglang.launch_server", "--tp", "8"], "sglang.launch_server --tp 8"),
    # A console script run by its shebang: the interpreter is given the script.
    (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"], "/usr/local/bin/vllm serve m"),
    (["pypy3", "-O", "serve.py", "-m", "x"], "serve.py -m x"),
    # The interpreter's own code: nothing it is given is the program.
    (["python3", "-c", "import os; os.execvp('llama-server', ['llama-server'])"],
     "python3 -c import os; os.execvp('llama-server', ['llama-server'])"),
    # Tools given a server's path run themselves.
    (["gdb", "--args", "/opt/llama-server", "-m", "m"], "gdb --args /opt/llama-server -m m"),
    (["strace", "-f", "vllm", "serve", "m"], "strace -f vllm serve m"),
    (["sh", "-c", "exec python -m sglang.launch_server"], "sh -c exec python -m sglang.launch_server"),
    ([], ""),
])
def test_invocation_is_the_program_a_process_runs(argv: list[str], runs: str) -> None:
    """argv[0], or a Python interpreter's module or script: what an engine's `program` pattern matches from its
    start, so that a tool given a server's path is not that server."""
    assert invocation(argv) == runs


@pytest.mark.parametrize(("name", "cmdline", "role"), [
    ("tgi", ["/usr/local/bin/text-generation-server", "serve", "bigscience/bloom-560m"], "server"),
    ("sglang", ["sglang::tokenizer_worker:4242"], "tokenizer_worker"),
    ("ollama", ["/usr/local/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/sha256-6a07", "--port",
                "40123", "--host", "127.0.0.1", "--no-webui", "--offline"], "runner"),
    ("ollama", ["/usr/local/bin/ollama", "runner", "--ollama-engine", "--model", "b", "--port", "40123"], "runner"),
    ("ollama", ["/usr/bin/nvidia-smi"], "nvidia-smi"),
])
def test_a_role_is_a_childs_title_or_the_program_it_runs(name: str, cmdline: list[str], role: str) -> None:
    assert role_name(cmdline, cmdline[0].rsplit("/", 1)[-1], ENGINES[name].role_title) == role
