"""Discovery of engines as processes, hostile ones included: odd argv, ports and titles, processes that exec, scripts
that start servers, gone servers, capped roles and swapped stdout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stallwatch.loops import POOL_WORKERS
from support import transcripts as t
from support.clock import Clock
from support.configs import FAST, FAST_REMEMBERING
from support.harness import LOADED_MACHINE, NOBODY, Engine, Exporter, Scrape, free_port, poll, require
from support.programs import SYSTEM_PYTHON, posing_as
from support.transcripts import llamacpp_healthy, sglang_until_shards
from support.watchers import candidate, watcher


def _up(scrape: Scrape, prefix: str) -> list[str]:
    return [ls["server"] for ls in scrape.labelsets("stallwatch_server_up") if ls["server"].startswith(prefix)
            and scrape.value("stallwatch_server_up", server=ls["server"]) == 1]


def _threads(e: Exporter) -> int:
    status = Path(f"/proc/{e.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def _started(e: Exporter) -> bool:
    """It logs that it listens once every loop has been started (`app.serve` starts them, then the CLI logs)."""
    return "listening on" in e.log.read_text()


def _series_of(scrape: Scrape, names: set[str]) -> list[str]:
    return [s.name for f in scrape.families.values() for s in f.samples if names & set(s.labels.values())]


# A server whose children each take a title of their own, burn some CPU and exit: 150 roles over ~3 s.
# 150 children, each with a title of its own and 20 ms of CPU, alive until `release` exists (a pipe's end they
# all wait on closes then); `done` once the last is reaped.
MANY_TITLES = """
import os, sys, time, setproctitle
release, done = sys.argv[-2:]
r, w = os.pipe()
for i in range(150):
    if os.fork() == 0:
        os.close(w)
        setproctitle.setproctitle(f"sglang::role{i}x")
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
        os.read(r, 1)
        os._exit(0)
while not os.path.exists(release):
    time.sleep(0.05)
os.close(w)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
open(done, "w").close()
time.sleep(3600)
"""


def _cpu_items(scrape: Scrape, server: str) -> list[tuple[tuple[str, str], float]]:
    return [((s.labels["process"], s.labels["mode"]), s.value)
            for s in scrape.samples("stallwatch_process_cpu_seconds_total") if s.labels["server"] == server]


# Runs as `nobody` with its stdout in a file of its own; on the trigger it swaps that file for a symlink to a
# root-only file and makes its stdout an O_PATH descriptor of it (which needs no read permission).
SWAPPER = """
import os, sys, time
out, secret, trigger, swapped = sys.argv[-4:]
os.write(1, b"started\\n")
while not os.path.exists(trigger):
    time.sleep(0.05)
os.unlink(out)
os.symlink(secret, out)
held = os.open(out, os.O_PATH)
os.dup2(held, 1)
os.dup2(held, 2)
open(swapped, "w").close()
time.sleep(3600)
"""








# A Python process whose argv names a vLLM server on `--port FIRST`, then execs (same pid and start time) into the
# command after `--`: the real server, on another port.


def exec_when(go: Path, script: Path) -> Path:
    """`script`: a Python program that waits until `go` exists, then execs the command after its `--`."""
    script.write_text(f"import os, sys, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
                      "rest = sys.argv[sys.argv.index('--') + 1:]\nos.execv(rest[0], rest)\n")
    return script




@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def sleeper(started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started.append(proc)
    return proc


def test_non_utf8_host_model_and_stdout_name_never_fail_a_page(exporter, engine) -> None:
    """A process whose `--host` in argv is a byte that is not UTF-8, and whose stdout file's name holds the byte
    0xff, would fail the exposition's or a page's encoding. Its log is exported with the path written `\\xff`, and
    `/` answers 200 while it runs and after it is gone."""
    e = exporter(config=FAST)
    sim = engine("sglang", sglang_until_shards(tp=1), tp=1, log_name="out-\udcff.log",  # the byte 0xff
                 args=("--host", "\udcfe", "--host", "127.0.0.1"))
    scrape = e.wait_for(lambda s: s.value("stallwatch_log_up", server=sim.name) == 1 and s, what="its log")
    assert scrape.log("stallwatch_log_up", server=sim.name, path=str(sim.log).replace("\udcff", "\\xff")) == 1
    assert e.get("/")[0] == 200
    sim.stop()  # the values stay while the server is remembered
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=sim.name) == 0, what="server down")
    assert e.get("/")[0] == 200


def test_bad_ports_in_argv_fall_back_and_later_servers_are_found(exporter, engine) -> None:
    """Processes whose argv gives `--port` as `²` (which passes `str.isdigit()` and fails `int()`), 99999, 0 or -1
    are watched under the engine's default port instead of raising in discovery, and a server started after them is
    still found."""
    e = exporter(config=FAST)
    # `²` passes str.isdigit() and fails int(); each of these is watched under the engine's default port.
    bad = [engine("sglang", sglang_until_shards(tp=1), tp=1, args=("--port", port)) for port in ("\u00b2", "99999",
                                                                                                 "0", "-1")]
    started = {psutil.Process(sim.proc.pid).create_time() for sim in bad}
    e.wait_for(lambda s: started <= {s.value("stallwatch_server_start_time_seconds", server=name)
                                     for name in _up(s, "sglang-30000")}, what="the four under the default port")
    later = engine("sglang", sglang_until_shards(tp=1), tp=1)
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=later.name) == 1, what="a later server")
    assert e.proc.poll() is None


def test_derived_probe_never_connects_where_the_server_does_not_listen(exporter, engine) -> None:
    """A process whose argv names a port where someone else's service listens (`--host 127.0.0.2 --port N`), while
    its own tree holds no LISTEN socket there, would make the exporter probe that service for it. The derived probe
    is counted `refused` without a packet sent, and the other service's listener never sees a connection. Nor does
    that listener count as the server's port listening: a server still loading beside an old one that holds its
    port (SGLang binds only once loaded) read as listening, and a stalled load's page said `port listening` (CI: a
    test's exporter took the stalled engine's port)."""
    with socket.socket() as ours:  # someone else's service on the port the engine's argv names
        ours.bind(("0.0.0.0", 0))
        ours.listen(16)
        ours.setblocking(False)
        port = ours.getsockname()[1]
        e = exporter(config=FAST)
        engine("sglang", sglang_until_shards(tp=1), tp=1, args=("--host", "127.0.0.2", "--port", str(port)))
        name = f"sglang-{port}"
        scrape = e.wait_for(lambda s: (s.value("stallwatch_probe_failures_total", server=name, reason="refused")
                                       or 0) >= 5 and s, what="probes recorded as refused")
        assert scrape.value("stallwatch_probe_success", server=name) == 0
        assert scrape.value("stallwatch_server_listening", server=name) == 0  # ours, not the server's
        with pytest.raises(BlockingIOError):
            ours.accept()  # no connection ever reached our listener


def test_probe_url_never_takes_a_name_or_path_from_argv(exporter, engine) -> None:
    """A process whose first `--host` is `127.0.0.1/admin/x?y=` would steer the derived probe to a path or a host
    name of its choosing. Of the command line only the port and an IP address are used, so the server's one probe URL
    is `http://127.0.0.1:PORT/health`."""
    e = exporter(config=FAST)
    # The exporter reads the first --host, the simulator binds the last one.
    sim = engine("llamacpp", llamacpp_healthy(), final="serve", tp=1,
                 args=("--host", "127.0.0.1/admin/x?y=", "--host", "127.0.0.1"))
    url = f"http://127.0.0.1:{sim.port}/health"
    scrape = e.wait_for(lambda s: s.probe("stallwatch_probe_success", server=sim.name, url=url) == 1 and s,
                        what="the probe of its own address")
    assert [ls["url"] for ls in scrape.labelsets("stallwatch_probe_info") if ls["server"] == sim.name] == [url]


def test_gone_servers_are_dropped_with_their_threads_and_series(exporter, engine) -> None:
    """30 discovered servers that exit would keep their loops and series for good, so processes that come and go
    would grow the exporter without end. After `discovery.forget_after` every series of theirs is gone, and the
    exporter's threads stay within the pools' bound throughout: they never grow with the number of servers. The caps
    are raised: the 30 and whatever else runs on the machine as root must all be watched."""
    e = exporter(config=FAST.replace("forget_after: 1s", "forget_after: 1s, max_servers: 4096, "
                                                         "max_servers_per_user: 4096"))
    poll(lambda: _started(e), what="the exporter to start its loops")
    # Probes and page fetches run on pools (loops.POOL_WORKERS threads each, and a deadline timer per request in
    # flight): the exporter's threads never grow with the servers, ours or other ones on the machine.
    bound = _threads(e) + 4 * POOL_WORKERS
    sims = [engine("llamacpp", llamacpp_healthy(), final="stall", tp=1) for _ in range(30)]
    names = {sim.name for sim in sims}
    e.wait_for(lambda s: names <= {ls["server"] for ls in s.labelsets("stallwatch_probe_failures_total")},
               timeout=30, what="all 30 discovered and probed")
    assert _threads(e) <= bound
    for sim in sims:
        sim.stop()
    e.wait_for(lambda s: not _series_of(s, names), timeout=30, what="every series dropped")
    assert _threads(e) <= bound


def test_roles_are_capped_and_their_cpu_never_goes_down(exporter, tmp_path: Path) -> None:
    """A server whose 150 children each take a process title of their own (setproctitle) and exit would add a CPU
    series per title. The roles stop at 64 plus `other`, and the CPU of the children that exited stays counted, so no
    `stallwatch_process_cpu_seconds_total` counter ever goes down."""
    e = exporter(config=FAST)
    release, done = tmp_path / "release", tmp_path / "done"
    port = free_port()
    proc = subprocess.Popen([*posing_as(tmp_path, "sglang", MANY_TITLES), "serve", "--port", str(port), str(release),
                             str(done)])
    name = f"sglang-{port}"

    def roles(scrape: Scrape) -> set[str]:
        return {role for (role, _), _ in _cpu_items(scrape, name)}

    try:
        # All 150 alive: more roles than the cap, so the rest is `other`.
        scrape = e.wait_for(lambda s: len(roles(s)) == 65 and s, what="64 roles and `other`")
        assert {"other", "main"} <= roles(scrape)
        previous = dict(_cpu_items(scrape, name))
        release.touch()
        deadline = time.monotonic() + 60 * LOADED_MACHINE
        while not done.exists():  # the children exit: what they used stays counted
            assert time.monotonic() < deadline, "the children did not finish"
            cpu = dict(_cpu_items(e.scrape(), name))
            assert all(cpu.get(key, -1.0) >= value for key, value in previous.items()), "a counter went down"
            assert len({role for role, _ in cpu}) <= 65, sorted(cpu)
            previous = cpu
        scrape = e.scrape()
        assert {"other", "main"} <= roles(scrape) and len(roles(scrape)) == 65
        total = sum(value for _, value in _cpu_items(scrape, name))
        assert total >= sum(previous.values()) and total > 1.0  # 150 children x 20 ms each, all kept
    finally:
        proc.kill()
        proc.wait()


def test_swapped_stdout_never_exports_a_root_only_file(exporter, shared_dir: Path) -> None:
    """A process of `nobody` swaps its stdout file for a symlink to a root-only file and makes its stdout an `O_PATH`
    descriptor of it, so that the exporter, as root, would read the file for it. The exporter opens a `/proc/PID/fd`
    link only while the process holds it open for writing, so the log goes down (`log_up 0`) and nothing of the file
    is counted, moves a gauge or names its path."""
    require("setpriv")
    secret = shared_dir / "secret"
    secret.write_text(sglang_until_shards(tp=1))  # lines that would move the phase and shard gauges
    secret.chmod(0o600)
    out, trigger, swapped = shared_dir / "out.log", shared_dir / "trigger", shared_dir / "swapped"
    port = free_port()
    e = exporter(config=FAST)
    out.touch()
    os.chown(out, 65534, 65534)
    with open(out, "ab") as stdout:
        proc = subprocess.Popen([*NOBODY, *posing_as(shared_dir, "sglang", SWAPPER, python=SYSTEM_PYTHON), "serve",
                                 "--port", str(port), str(out), str(secret), str(trigger), str(swapped)],
                                env={"PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.STDOUT)
    name = f"sglang-{port}"
    try:
        e.wait_for(lambda s: s.value("stallwatch_log_size_bytes", server=name) == len("started\n")
                   and s.value("stallwatch_log_up", server=name) == 1, what="its own first line")
        trigger.touch()
        poll(swapped.exists, what="the swap")
        scrape = e.wait_for(lambda s: s.value("stallwatch_log_up", server=name) == 0 and s, what="log down")
        # Its first line was there before it was found: replayed for the phase, not counted as read.
        assert scrape.value("stallwatch_log_lines_total", server=name) == 0
        assert scrape.value("stallwatch_log_read_bytes_total", server=name) == 0
        assert scrape.value("stallwatch_log_size_bytes", server=name) == len("started\n")
        assert scrape.value("stallwatch_weight_shards_expected", server=name) is None
        assert str(secret) not in scrape.text
    finally:
        proc.kill()
        proc.wait()


def test_a_discovered_process_never_becomes_a_configured_server(exporter, engine, tmp_path: Path) -> None:
    """The configured server (no name: `sglang-30000`) is down; a process with the default port in its argv is
    discovered beside it, as `sglang-30000-2`: the configured server stays down, so InferenceServerDown fires."""
    token = f"real-{os.getpid()}-{tmp_path.name}"
    e = exporter(config=FAST_REMEMBERING + "servers:\n  - engine: sglang\n"
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
    its argv comes first: it is `<name>@uid65534`, and the real server, relaunched by its own user, gets its name
    back."""
    e = exporter(config=FAST_REMEMBERING)
    first = engine("llamacpp", t.llamacpp_healthy(), final="stall", tp=1)
    name = first.name
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, what="the server")
    first.stop()
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 0, what="it to go down")
    other = Engine(shared_dir, "llamacpp", t.llamacpp_healthy(), final="stall", tp=1, port=first.port, prefix=NOBODY)
    try:
        scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=f"{name}@uid65534") == 1 and s,
                            timeout=15, what="the other user's process, under a name of its own")
        assert scrape.value("stallwatch_server_up", server=name) == 0
        engine("llamacpp", t.llamacpp_healthy(), final="stall", tp=1, port=first.port, log_name="relaunch.log")
        e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, timeout=15,
                   what="the relaunch under its own name")
    finally:
        other.stop()


def test_another_users_process_that_starts_first_holds_the_name_only_until_roots_server(exporter, engine,
                                                                                        shared_dir: Path) -> None:
    """Audit 2026-12-02 #11: another user's process on the port started first, and root's real server was `<name>-2`
    for good, the squatter's gone entry `server_up 0` under the expected name. Root's takes the plain name, the
    other is `<name>@uid65534`, and its end changes nothing of root's."""
    e = exporter(config=FAST_REMEMBERING)
    port = free_port()
    other = Engine(shared_dir, "llamacpp", t.llamacpp_healthy(), final="stall", tp=1, port=port, prefix=NOBODY)
    try:
        name = other.name
        e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, what="the other user's process")
        real = engine("llamacpp", t.llamacpp_healthy(), final="stall", tp=1, port=port, log_name="real.log")
        scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=f"{name}@uid65534") == 1 and s,
                            timeout=15, what="root's server under the plain name, the other's renamed")
        assert scrape.value("stallwatch_server_up", server=name) == 1
        assert scrape.value("stallwatch_server_up", server=f"{name}-2") is None
    finally:
        other.stop()
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=f"{name}@uid65534") == 0 and s,
                        what="the other user's process gone")
    assert scrape.value("stallwatch_server_up", server=name) == 1
    assert real.proc.poll() is None


def test_a_main_process_that_execs_is_read_anew(exporter, engine, tmp_path: Path) -> None:
    """A main process found with a vLLM argv on one port that then execs (same pid and start time) into the real
    server on another port was watched on the old port for good and paged as never listening
    (docs/research/audit-2026-12-01.md #10). Its argv is read anew: the new port listens, its probe passes, it is
    serving, and the old port has no series."""
    e = exporter(config=FAST_REMEMBERING)
    first, go = free_port(), tmp_path / "exec"
    sim = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1, work={"running": 0, "waiting": 0},
                 prefix=[sys.executable, str(exec_when(go, tmp_path / "vllm")), "serve", "--port", str(first), "--"])
    name = f"vllm-{first}"
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, what="the process before its exec")
    go.touch()
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_listening", server=name, port=str(sim.port)) == 1
                        and s.probe("stallwatch_probe_success", server=name,
                                    url=f"http://127.0.0.1:{sim.port}/health") == 1 and s,
                        timeout=20, what="the port and probe of the program it exec'd")
    assert scrape.value("stallwatch_startup_phase", server=name, phase="serving") == 1
    assert scrape.value("stallwatch_server_listening", server=name, port=str(first)) is None


def test_a_shell_scripts_process_is_not_the_server_it_starts(exporter, engine, tmp_path: Path) -> None:
    """`sh -c 'sleep 1; exec python -m vllm... --port N'`, as manifests and entrypoints write it: the shell is not
    discovered (its port would be read as the default 8000, a healthy idle server paged as never listening); the
    program it execs is, on its own port."""
    e = exporter(config=FAST_REMEMBERING)
    sim = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1, work={"running": 0, "waiting": 0},
                 shell="sleep 1")
    e.wait_for(lambda s: s.probe("stallwatch_probe_success", server=sim.name,
                                 url=f"http://127.0.0.1:{sim.port}/health") == 1, timeout=20,
               what="the program the script execs")
    assert f"(pid {sim.proc.pid}, host)" in e.log.read_text()
    assert "vllm-8000" not in e.log.read_text()


@pytest.mark.process
def test_a_workload_restarted_keeps_its_name_and_a_new_launch(tmp_path: Path, sleepers: list) -> None:
    first = sleeper(sleepers)
    found = [candidate(first.pid)]
    w = watcher(tmp_path, found)
    w.refresh()
    (server,) = w.servers()
    first.kill()
    first.wait()
    second = sleeper(sleepers)
    found[:] = [candidate(second.pid)]
    w.refresh()
    assert w.servers() == [server] and server.name == "sglang-30000" and server.launch.pid == second.pid


@pytest.mark.process
def test_a_gone_discovered_server_is_forgotten_after_forget_after(tmp_path: Path, sleepers: list) -> None:
    proc = sleeper(sleepers)
    found, clock = [candidate(proc.pid)], Clock()
    w = watcher(tmp_path, found, clock)
    told: list[list[str]] = []
    w.on_change(lambda servers: told.append([s.name for s in servers]))
    w.refresh()
    proc.kill()
    proc.wait()
    found.clear()
    w.refresh()  # gone from now on
    clock.now += 59
    w.refresh()
    assert [s.name for s in w.servers()] == ["sglang-30000"]
    clock.now += 1
    w.refresh()
    assert w.servers() == [] and told[-1] == []

