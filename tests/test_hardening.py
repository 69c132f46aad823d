"""Issue 11: input from other users' processes and from config files, hostile or broken, is never fatal.

Each test reproduces one attack or fault from the issue (numbered as there)."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from stallwatch.collectors import StallwatchCollector
from stallwatch.collectors.logs import LogsCollector
from stallwatch.config import Config
from stallwatch.config.reader import ConfigError
from stallwatch.discovery.watcher import Watcher
from stallwatch.logs.follow import LogFile
from stallwatch.logs.source import LogSource
from stallwatch.loops import POOL_WORKERS
from stallwatch.signals.logs import LogManager
from stallwatch.signals.probes import probe
from support.configs import GOOD, check_config, parse
from support.harness import Exporter, Scrape, free_port, poll, require
from support.transcripts import llamacpp_healthy, sglang_until_shards
from support.watchers import log_watcher

# Discovery, probes and log polling fast enough that each test takes seconds.
FAST = ("discovery: {enabled: true, interval: 0.2s, forget_after: 1s}\n"
        "defaults: {probe: {interval: 0.2s, timeout: 1s}}\nlogs: {poll_interval: 0.1s}\n")

# --- 10. config: every input is loaded or refused with exit 2 and `file:line: key: reason` ---------------------


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ('servers:\n  - {engine: sglang, name: "x\\ud800"}\n', "servers[0].name", "valid Unicode"),  # item 1
        ("discovery: {interval: .inf}\n", "discovery.interval", "duration from 0"),
        ("discovery: {interval: .nan}\n", "discovery.interval", "duration from 0"),
        ("discovery: {interval: -5}\n", "discovery.interval", "duration from 0"),
        ("discovery: {interval: 99999999999999999999h}\n", "discovery.interval", "duration from 0"),
        ("discovery: {forget_after: .inf}\n", "discovery.forget_after", "duration from 0"),
        ("defaults: {stall: {gpu_memory_bytes: .inf}}\n", "defaults.stall.gpu_memory_bytes", "size from 0"),
        ("defaults: {stall: {gpu_memory_bytes: .nan}}\n", "defaults.stall.gpu_memory_bytes", "size from 0"),
        ("defaults: {stall: {gpu_memory_bytes: 0x" + "f" * 300 + "}}\n", "defaults.stall.gpu_memory_bytes",
         "out of range"),
        ('servers:\n  - {engine: sglang, logs: ["/var/log/a\\0b"]}\n', "servers[0].logs[0]", "NUL"),
        ("servers:\n  - {engine: generic, match: {cmdline: x}, patterns: {serving: ['(?u)ready']}}\n",
         "servers[0].patterns.serving[0]", "invalid regular expression"),
        ("servers:\n  - {engine: generic, match: {cmdline: x}, patterns: {serving: ['\\N{DIGIT ONE}']}}\n",
         "servers[0].patterns.serving[0]", "invalid regular expression"),
        ("servers:\n  - {engine: generic, match: {cmdline: 'a{4294967296}'}}\n", "servers[0].match.cmdline",
         "invalid regular expression"),
        ("servers:\n  - {engine: generic, match: {cmdline: '" + "a" * 5000 + "'}}\n", "servers[0].match.cmdline",
         "longer than"),
        ("servers: !foo [1]\n", "servers", "unsupported tag"),
        ("gpu: !!python/object:os.system {}\n", "gpu", "unsupported tag"),
        ("servers:\n  - {engine: sglang, probes: [{url: 'http://127.0.0.1:99999/health'}]}\n",
         "servers[0].probes[0].url", "out of range"),
        ("{[a]: 1}\n", "<a list>", "unknown key"),
        ("a: " + "[" * 40 + "]" * 40 + "\n", "a", "nested deeper"),
    ],
)
def test_bad_values_are_refused_with_file_line_and_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(text, file="c.yml")
    assert f": {key}" in str(refused.value) and reason in str(refused.value)
    assert str(refused.value).startswith("c.yml:")


@pytest.mark.process
def test_check_config_exits_2_for_refused_values(tmp_path: Path) -> None:
    result = check_config(tmp_path, 'servers:\n  - {engine: sglang, name: "x\\ud800"}\n')  # item 1
    assert result.returncode == 2 and "servers[0].name" in result.stderr, result.stderr
    result = check_config(tmp_path, "[" * 100_000)  # PyYAML's composer would recurse past the limit
    assert result.returncode == 2 and "nested deeper" in result.stderr, result.stderr


@pytest.mark.process
def test_big_and_non_regular_config_files_are_refused_without_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.yml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    result = check_config(tmp_path, None, "big.yml")
    assert result.returncode == 2 and "larger than" in result.stderr, result.stderr
    os.mkfifo(tmp_path / "fifo.yml")  # nobody writes it: a blocking open would never return
    result = check_config(tmp_path, None, "fifo.yml")
    assert result.returncode == 2 and "not a regular file" in result.stderr, result.stderr


def _mutation(rng: random.Random) -> str:
    """One hostile fragment: the shapes that gave tracebacks in the issue's fuzzing, and random bytes."""
    return rng.choice([
        "[" * rng.randint(10, 3000), "{a: " * rng.randint(10, 3000), "!foo ", "!!binary ", "!!python/tuple ",
        "0x" + "f" * rng.randint(300, 2000), ".inf", "-.inf", ".nan", "1e999", "-1", "'(?u)x'", "'\\N{DIGIT ONE}'",
        "'a{99999999999}'", "'" + "(" * 500 + "'", '"\\ud800"', '"\\0"', "&a [*a]", "*nowhere", "? [k]: v",
        "2024-13-45", "'a{1000}{1000}{1000}'", "\t", ": :", "- - -", "~",
        "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(1, 20))),
    ])


def _fuzzed(rng: random.Random) -> str:
    lines = GOOD.splitlines()
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        head, _, value = lines[i].partition(": ")
        lines[i] = f"{head}: {_mutation(rng)}" if value and rng.random() < 0.7 else _mutation(rng)
    return "\n".join(lines) + "\n"


def test_fuzzed_configs_load_or_are_refused() -> None:
    rng = random.Random(11)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(200):
        text = _fuzzed(rng)
        try:
            assert isinstance(parse(text, file="f.yml"), Config)
            outcomes["loaded"] += 1
        except ConfigError as exc:
            assert str(exc).startswith("f.yml"), exc
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100, outcomes


# --- 1. bytes that are not UTF-8 are escaped for display, never fatal ---------------------------------------------


def test_non_utf8_host_model_and_stdout_name_never_fail_a_page(exporter, engine) -> None:
    e = exporter(config=FAST)
    sim = engine("sglang", sglang_until_shards(tp=1), tp=1, log_name="out-\udcff.log",  # the byte 0xff
                 args=("--host", "\udcfe", "--host", "127.0.0.1"))
    scrape = e.wait_for(lambda s: s.value("stallwatch_log_up", server=sim.name) == 1 and s, what="its log")
    assert scrape.value("stallwatch_log_up", server=sim.name, path=str(sim.log).replace("\udcff", "\\xff")) == 1
    assert e.get("/")[0] == 200
    sim.stop()  # the values stay while the server is remembered
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=sim.name) == 0, what="server down")
    assert e.get("/")[0] == 200


# --- 2. ports: only ASCII digits 1-65535; a bad one never stops discovery -----------------------------------------


def _up(scrape: Scrape, prefix: str) -> list[str]:
    return [ls["server"] for ls in scrape.labelsets("stallwatch_server_up") if ls["server"].startswith(prefix)
            and scrape.value("stallwatch_server_up", server=ls["server"]) == 1]


def test_bad_ports_in_argv_fall_back_and_later_servers_are_found(exporter, engine) -> None:
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


# --- 3. derived probes never scan ports for other users -------------------------------------------------------------


def test_derived_probe_never_connects_where_the_server_does_not_listen(exporter, engine) -> None:
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
        assert scrape.value("stallwatch_server_listening", server=name) == 1  # ours, in its namespace
        with pytest.raises(BlockingIOError):
            ours.accept()  # no connection ever reached our listener


def test_probe_url_never_takes_a_name_or_path_from_argv(exporter, engine) -> None:
    e = exporter(config=FAST)
    # The exporter reads the first --host, the simulator binds the last one.
    sim = engine("llamacpp", llamacpp_healthy(), final="serve", tp=1,
                 args=("--host", "127.0.0.1/admin/x?y=", "--host", "127.0.0.1"))
    url = f"http://127.0.0.1:{sim.port}/health"
    scrape = e.wait_for(lambda s: s.value("stallwatch_probe_success", server=sim.name, url=url) == 1 and s,
                        what="the probe of its own address")
    assert [ls["url"] for ls in scrape.labelsets("stallwatch_probe_success") if ls["server"] == sim.name] == [url]


# --- 4. discovered servers that are gone are forgotten after a grace period --------------------------------------


def _threads(e: Exporter) -> int:
    status = Path(f"/proc/{e.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def _started(e: Exporter) -> bool:
    """It logs that it listens once every loop has been started (`app.serve` starts them, then the CLI logs)."""
    return "listening on" in e.log.read_text()


def _series_of(scrape: Scrape, names: set[str]) -> list[str]:
    return [s.name for f in scrape.families.values() for s in f.samples if names & set(s.labels.values())]


def test_gone_servers_are_dropped_with_their_threads_and_series(exporter, engine) -> None:
    e = exporter(config=FAST)
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


# --- 5. roles per server capped; exited children's CPU kept ------------------------------------------------------

# A server whose children each take a title of their own, burn some CPU and exit: 150 roles over ~3 s.
MANY_TITLES = """
import os, sys, time, setproctitle
for i in range(150):
    if os.fork() == 0:
        setproctitle.setproctitle(f"sglang::role{i}x")
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass
        time.sleep(0.5)
        os._exit(0)
    time.sleep(0.02)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
open(sys.argv[-1], "w").close()
time.sleep(3600)
"""


def test_roles_are_capped_and_their_cpu_never_goes_down(exporter, tmp_path: Path) -> None:
    e = exporter(config=FAST)
    script, done = tmp_path / "titles.py", tmp_path / "done"
    script.write_text(MANY_TITLES)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), "sglang.launch_server", "--port", str(port), str(done)])
    name = f"sglang-{port}"
    previous: dict[tuple[str, str], float] = {}
    try:
        deadline = time.monotonic() + 60
        while not done.exists() or not previous:
            assert time.monotonic() < deadline, "the children did not finish"
            cpu = dict(_cpu_items(e.scrape(), name))
            assert all(cpu.get(key, -1.0) >= value for key, value in previous.items()), "a counter went down"
            assert len({role for role, _ in cpu}) <= 65, sorted(cpu)
            previous = cpu
        scrape = e.scrape()
        roles = {role for (role, _), _ in _cpu_items(scrape, name)}
        assert "other" in roles and "main" in roles and len(roles) == 65
        total = sum(value for _, value in _cpu_items(scrape, name))
        assert total >= sum(previous.values()) and total > 1.0  # 150 children x 20 ms each, all kept
    finally:
        proc.kill()
        proc.wait()


def _cpu_items(scrape: Scrape, server: str) -> list[tuple[tuple[str, str], float]]:
    return [((s.labels["process"], s.labels["mode"]), s.value)
            for s in scrape.samples("stallwatch_process_cpu_seconds_total") if s.labels["server"] == server]


# --- 6. a log found through another process is never a way to read a file its owner cannot ------------------------

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
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_swapped_stdout_never_exports_a_root_only_file(exporter, shared_dir: Path) -> None:
    require("setpriv")
    secret = shared_dir / "secret"
    secret.write_text(sglang_until_shards(tp=1))  # lines that would move the phase and shard gauges
    secret.chmod(0o600)
    (shared_dir / "swapper.py").write_text(SWAPPER)
    out, trigger, swapped = shared_dir / "out.log", shared_dir / "trigger", shared_dir / "swapped"
    port = free_port()
    e = exporter(config=FAST)
    out.touch()
    os.chown(out, 65534, 65534)
    with open(out, "ab") as stdout:
        proc = subprocess.Popen([*NOBODY, "/usr/bin/python3", str(shared_dir / "swapper.py"), "sglang.launch_server",
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


# --- 7. the log follower never blocks, one file never stops the others, a dead loop shows ----------------------


def _watcher_with_logs(tmp_path: Path, count: int) -> tuple[Watcher, list[Path]]:
    files = [tmp_path / f"{i}.log" for i in range(count)]
    for f in files:
        f.write_bytes(b"hello\n")
    return log_watcher({f"s{i}": [f] for i, f in enumerate(files)}), files


def test_file_swapped_for_a_fifo_between_stat_and_open_does_not_block(tmp_path: Path) -> None:
    watcher, (path,) = _watcher_with_logs(tmp_path, 1)
    server = watcher.servers()[0]
    follower = LogFile(server.name, server.launch.log_sources[0], server.interpreter)
    before = os.stat(path)  # what the follower's stat saw
    path.unlink()
    os.mkfifo(path)  # ... and what is there when it opens: nobody ever writes it
    errors: list[BaseException] = []

    def switch() -> None:
        try:
            follower._switch(before)
        except OSError as exc:
            errors.append(exc)

    thread = threading.Thread(target=switch, daemon=True)
    thread.start()
    thread.join(5)
    blocked = thread.is_alive()
    if blocked:  # unblock the stuck open, so the test ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    assert not blocked, "the follower blocked on a FIFO"
    assert errors and "not a regular file" in str(errors[0])


def test_one_bad_file_is_its_own_log_up_0_and_the_others_go_on(tmp_path: Path) -> None:
    watcher, _ = _watcher_with_logs(tmp_path, 2)
    bad = watcher.servers()[0]
    # What config now refuses: ValueError.
    bad.launch = dataclasses.replace(bad.launch, log_sources=(LogSource("/var/log/x\0y", "/var/log/x\0y"),))
    manager = LogManager(watcher, 0.1)
    manager.poll()
    stats = {s.server: s for s in manager.stats()}
    assert stats["s0"].up is False
    assert stats["s1"].up is True and stats["s1"].size == len("hello\n")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the loop that dies
@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_dead_or_stuck_follower_fails_the_logs_collector(tmp_path: Path, how: str) -> None:
    watcher, _ = _watcher_with_logs(tmp_path, 1)
    manager = LogManager(watcher, 0.05, stale_after=0.5)
    root = StallwatchCollector({"logs": LogsCollector(manager, watcher)})
    stuck = threading.Event()

    def broken() -> None:
        if how == "dies":
            raise SystemExit  # not an Exception: the loop's own guard does not catch it
        stuck.wait(30)

    manager.poll = broken  # type: ignore[method-assign]
    manager.start()
    try:
        poll(lambda: _success(root, "logs") == 0, what="collector_success{collector=logs} 0")
    finally:
        stuck.set()
        manager.stop()


def _success(root: StallwatchCollector, name: str) -> float:
    family = next(f for f in root.collect() if f.name == "stallwatch_collector_success")
    return next(s.value for s in family.samples if s.labels["collector"] == name)


# --- 9. a probe has one deadline for the whole request ----------------------------------------------------------


def test_a_target_that_trickles_headers_times_out_at_the_deadline() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        done = threading.Event()

        def trickle() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for _ in range(100):  # a header byte every 0.1 s for 10 s: each read is well within the timeout
                    if done.wait(0.1):
                        return
                    conn.sendall(b"X")

        server = threading.Thread(target=trickle, daemon=True)
        server.start()
        start = time.monotonic()
        result = probe(f"http://127.0.0.1:{listener.getsockname()[1]}/health", timeout=1.0)
        elapsed = time.monotonic() - start
        done.set()
        server.join(5)
    assert result.reason == "timeout" and not result.success
    assert elapsed < 2.0, elapsed


def test_a_probe_url_with_a_bad_port_fails_without_raising() -> None:
    assert probe("http://127.0.0.1:99999/health", timeout=1.0).reason == "error"
