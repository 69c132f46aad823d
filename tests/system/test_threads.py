"""The threads of a running exporter are the ones `docs/architecture.md` lists ("Threads"), by their names: every
thread that runs is in the table, and every thread the table says runs always is running. The names come from
`py-spy dump` (Python 3.11 does not give them to the kernel: `/proc/PID/task/*/comm` says `python`), while a
simulated engine is watched and probed, and while its status page takes its stacks."""

from __future__ import annotations

import re
import subprocess
import threading
from dataclasses import dataclass
from importlib.metadata import version

import pytest

from stallwatch.report.stacks import pyspy_binary
from support import transcripts as t
from support.harness import gpus, poll
from support.paths import ROOT

pytestmark = pytest.mark.process

ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+?) \|", re.MULTILINE)
THREAD = re.compile(r'^Thread \S+ \([^)]*\): "(.*)"\s*$')
# A thread nobody named is `Thread-N`: the table says those are watchdog's.
UNNAMED = re.compile(r"^Thread-\d+$")
UNNAMED_FRAMES = ("watchdog/",)


@dataclass(frozen=True)
class Documented:
    name: str
    pattern: re.Pattern[str]
    running: bool  # in this test: always, or while a log directory is watched (this test watches one)


def documented_threads() -> list[Documented]:
    """The Threads table's rows: `N` in a name is a number, `<server>` a server's name."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("\n## Threads\n", 1)[1].split("\n#", 1)[0]
    rows = []
    for name, running in ROW.findall(section):
        if name == "thread":
            continue
        parts = re.split(r"((?<![A-Za-z])N(?![A-Za-z])|<server>)", name)
        regex = "".join(r"\d+" if p == "N" else ".+" if p == "<server>" else re.escape(p) for p in parts)
        rows.append(Documented(name, re.compile(regex), _runs_here(running)))
    assert rows, "no Threads table in docs/architecture.md"
    return rows


def _runs_here(running: str) -> bool:
    """Whether a row's "running" column says the thread runs in this test: always, or while a log directory is
    watched, by the installed watchdog (`(watchdog ≥ 7)`: from that major version only)."""
    if running.startswith("always"):
        return True
    if not running.startswith("while a log directory is watched"):
        return False
    floor = re.search(r"watchdog ≥ (\d+)", running)
    return floor is None or int(version("watchdog").split(".")[0]) >= int(floor.group(1))


def running_threads(pid: int) -> list[tuple[str, list[str]]]:
    """The name and frames of each Python thread of `pid`, from `py-spy dump`."""
    out = subprocess.run([pyspy_binary() or "py-spy", "dump", "--pid", str(pid)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    threads: list[tuple[str, list[str]]] = []
    for line in out.stdout.splitlines():
        head = THREAD.match(line)
        if head:
            threads.append((head.group(1), []))
        elif threads and line.startswith(" "):
            threads[-1][1].append(line.strip())
    return threads


def test_the_running_threads_are_the_documented_ones(exporter, engine) -> None:
    rows = documented_threads()
    sim = engine("vllm", t.vllm_healthy(), final="serve", tp=1)
    # Two GPUs: their readers, NVML's events, the kernel log; evidence: the status page's stack rounds. Its log by
    # path: a watched directory (a stdout file followed through /proc/PID/fd has none), so watchdog's threads run.
    config = (f"web: {{show_evidence: true}}\nservers:\n  - name: {sim.name}\n    engine: vllm\n"
              f"    match: {{cmdline: '--port {sim.port}'}}\n    logs: ['{sim.log}']\n")
    e = exporter(nvml={"gpus": gpus(2)}, config=config)
    url = f"http://127.0.0.1:{sim.port}/health"
    # Probed: the server is watched, so both pools (probes, engine pages) have threads.
    e.wait_for(lambda s: s.probe("stallwatch_probe_success", server=sim.name, url=url) == 1, timeout=30,
               what="the simulated engine probed")

    seen: dict[str, list[str]] = {}  # each name seen in any dump, with its frames then (`Thread-N` names are unique)

    def every_always_thread_runs() -> bool:
        now = running_threads(e.proc.pid)
        seen.update(now)
        names = [name for name, _ in now]
        missing = [row.name for row in rows if row.running and not any(row.pattern.fullmatch(n) for n in names)]
        assert not missing, f"documented as running here, not running: {missing}; running: {sorted(set(names))}"
        return True

    poll(every_always_thread_runs, timeout=60, interval=0.5, what="every thread the table says runs here")
    # A status page with evidence takes the server's stacks: its round's threads (py-spy's pool, its deadlines)
    # are checked too when a dump catches them.
    page = threading.Thread(target=e.get, args=(f"/servers/{sim.name}",), daemon=True)
    page.start()
    while page.is_alive():
        seen.update(running_threads(e.proc.pid))
    undocumented = sorted(name for name in seen if not any(row.pattern.fullmatch(name) for row in rows))
    assert not undocumented, f"threads not in docs/architecture.md's Threads table: {undocumented}"
    strangers = {name: frames for name, frames in seen.items()
                 if UNNAMED.match(name) and not any(mark in f for f in frames for mark in UNNAMED_FRAMES)}
    assert not strangers, f"unnamed threads that are neither watchdog's nor a timer: {strangers}"
