"""Hostile logs, engine pages and stacks, round two: a log of nothing but notable lines, a file shared by several
servers' processes, a page bomb of tiny series, a py-spy dump of thousands of deep threads, forged Docker streams
and the engine page's error on the status page. Each test reproduces one defect of
`../shared/research/audit-2026-12-01.md` (numbered as there) and fails without its fix; the speed and memory
figures are `tests/bench/bench_logs.py`'s, `bench_engine_page.py`'s and `bench_status.py`'s."""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.engines import ENGINES
from stallwatch.engines.base import rule
from stallwatch.logs import interpret
from stallwatch.logs.follow import LogFile
from stallwatch.logs.formats import DockerJsonDecoder
from stallwatch.logs.interpret import LogInterpreter, Matcher
from stallwatch.logs.prefilter import compile_rules
from stallwatch.report import live, stacks
from stallwatch.report.live import StatusPages
from stallwatch.report.model import StackGroup
from stallwatch.signals.engine_page import MAX_SAMPLES, parse_page
from stallwatch.signals.logs import LogManager
from stallwatch.web.routes import status_path
from support import transcripts
from support.clock import Clock
from support.harness import poll
from support.watchers import log_watcher

TRACEBACK = b"Traceback (most recent call last)\n"
LAUNCH = b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m', tp_size=1)\n"


class Scanned(bytes):
    """A block that adds up the bytes its `find` and `rfind` calls look at, and counts its `splitlines` calls."""

    looked = 0
    splits = 0

    def find(self, sub: bytes, start: int = 0, end: int | None = None, /) -> int:  # type: ignore[override]
        end = len(self) if end is None else end
        found = super().find(sub, start, end)
        self.looked += (found + len(sub) if found >= 0 else end) - start
        return found

    def rfind(self, sub: bytes, start: int = 0, end: int | None = None, /) -> int:  # type: ignore[override]
        end = len(self) if end is None else end
        found = super().rfind(sub, start, end)
        self.looked += end - (found if found >= 0 else start)
        return found

    def splitlines(self, keepends: bool = False) -> list[bytes]:  # type: ignore[override]
        self.splits += 1
        return super().splitlines(keepends)


# --- 7. a log of notable lines costs each byte once, the cap bounds a block, no file holds back the others -------


@pytest.mark.parametrize("end", [b"\n", b"\r"])
def test_line_bounds_look_at_each_byte_a_bounded_number_of_times(end: bytes) -> None:
    """Each hit's line was found by searching for `\\r` to the block's ends: a thousand looks at each byte."""
    stats = b"".join(b"[2026-11-20 10:00:00 DP%d TP0] Decode batch, #running-req: 1, #token: 4096, cuda graph: True, "
                     b"gen throughput (token/s): 10.00, #queue-req: 0\n" % rank for rank in range(64))
    block = Scanned(TRACEBACK.replace(b"\n", end) * 2000 + b"\n" + stats)
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.feed(block)
    assert interpreter.snapshot().events["fatal"] == 2000
    figures = interpreter.figures()  # the stats line of each DP rank, read back from the end
    assert figures is not None and figures.running == 64
    assert block.looked < 4 * len(block), f"{block.looked / len(block):.0f} looks a byte"


def test_a_block_of_nothing_but_notable_lines_is_cut_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpret, "MAX_CANDIDATE_LINES", 100)
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.feed(TRACEBACK * 1000)
    assert interpreter.snapshot().events["fatal"] == 100
    interpreter.feed(LAUNCH)  # the next block is read again
    assert interpreter.snapshot().phase == "launching"


def test_heartbeat_blocks_are_judged_without_a_python_loop_over_lines() -> None:
    now = [1000.0]
    interpreter = LogInterpreter(ENGINES["tgi"], wall=lambda: now[0])
    beats = transcripts.tgi_shard_stuck(1200).split("rank=1\n", 2)[2].encode()
    block = Scanned(beats * 40)
    interpreter.feed(block)
    assert interpreter.progress() is None and block.splits == 0
    now[0] = 1010.0
    interpreter.feed(Scanned(beats + b"2026-11-20T09:20:05Z  INFO shard-manager: Shard ready in 1201.2s rank=0\n"))
    assert interpreter.progress() == 1010.0


def test_only_the_rules_of_the_literals_found_run_and_find_what_the_whole_alternation_finds() -> None:
    """The alternation of every rule, tried at each byte, cost a millisecond for a 4 KiB line."""
    texts = [transcripts.sglang_healthy(), transcripts.sglang_graph_crash(), transcripts.sglang_nccl_timeout(),
             transcripts.vllm_healthy(), transcripts.vllm_shm_stall(), transcripts.vllm_v0(),
             transcripts.tgi_healthy(), transcripts.tgi_shard_crash(), transcripts.llamacpp_load_error()]
    lines = [line for text in texts for line in text.encode().replace(b"\r", b"\n").split(b"\n")]
    checked = 0
    for engine in ENGINES.values():
        matcher = Matcher(engine)
        for compiled in (matcher.startup, matcher.serving):
            assert compiled.prefilter is not None
            for line in lines:
                hit = compiled.prefilter.search(line)
                whole = [(m.lastgroup, m.span()) for m in compiled.regex.finditer(line)]
                found = [] if hit is None else [(group, m.span()) for group, m in
                                                 compiled.matches(line, 0, len(line), hit.start())]
                assert found == whole, (engine.name, line)
                checked += bool(whole)
    assert checked > 300
    # Literals that overlap: a search that went on after the first one's end would not see the second one's rule,
    # whose match begins further left and so is the one the alternation finds.
    overlapping = compile_rules([rule("xabc", event="fatal"), rule("q.*bcdz", event="oom")], None)
    line = b"q xabcdz"
    assert [m.lastgroup for m in overlapping.regex.finditer(line)] == ["r1"]
    assert [group for group, _ in overlapping.matches(line, 0, len(line), line.index(b"xabc"))] == ["r1"]


def test_a_file_of_notable_lines_does_not_hold_back_another_servers_log(tmp_path: Path) -> None:
    """The follower replayed and read a file of tracebacks for minutes before it looked at any other file."""
    hostile, real = tmp_path / "hostile.log", tmp_path / "real.log"
    hostile.write_bytes(TRACEBACK * ((16 << 20) // len(TRACEBACK)))
    real.write_bytes(b"")
    watcher = log_watcher({"hostile": [hostile], "real": [real]})
    servers = {s.name: s for s in watcher.servers()}
    fed: list[int] = []
    seen_after: list[int] = []

    def hostile_tap(block: bytes) -> None:
        if not fed:  # the real server writes while the follower is busy with the other file
            real.write_bytes(LAUNCH)
        fed.append(len(block))

    servers["hostile"].interpreter.tap = hostile_tap
    servers["real"].interpreter.tap = lambda block: seen_after.append(sum(fed))
    manager = LogManager(watcher, poll_interval=0.1)
    manager.start()
    try:
        poll(lambda: servers["real"].interpreter.snapshot().phase == "launching", timeout=60,
             what="the real server's line")
    finally:
        manager.stop()
    assert seen_after[0] < hostile.stat().st_size / 2, "the real line waited for the other file"


def test_a_file_shared_by_several_servers_is_replayed_once(tmp_path: Path) -> None:
    shared = tmp_path / "shared.log"
    shared.write_bytes(transcripts.sglang_healthy(tp=1).encode())
    watcher = log_watcher({f"s{i}": [shared] for i in range(3)})
    manager = LogManager(watcher, poll_interval=1.0)
    manager.poll()
    phases = sorted(s.interpreter.snapshot().phase for s in watcher.servers())
    assert phases == ["serving", "stopped", "stopped"]
    with open(shared, "ab") as f:
        f.write(LAUNCH)
    manager.poll()  # what is new reaches every server
    assert [s.interpreter.snapshot().phase for s in watcher.servers()] == ["launching"] * 3


def test_a_log_read_behind_its_end_grew_when_its_size_did(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_bytes(b"")
    clock = Clock()
    server = log_watcher({"s": [path]}).servers()[0]
    follower = LogFile(server.name, server.launch.log_sources[0], server.interpreter, wall=clock, recover=False)
    path.write_bytes(b"x" * 99 + b"\n" + b"y" * ((3 << 20) - 100))
    assert follower.poll(deadline=0.0)  # one chunk a poll, past its deadline: more is left
    grew = clock.now
    clock.now += 10
    assert follower.poll(deadline=0.0)
    assert follower.stats().last_growth == grew and follower.stats().read_bytes == 2 << 20
    with open(path, "ab") as f:
        f.write(b"\n")
    assert not follower.poll()
    assert follower.stats().last_growth == clock.now and follower.stats().read_bytes == (3 << 20) + 1


# --- 8. a py-spy dump is read bounded and kept small, pages of servers never wait for each other -----------------


@pytest.mark.parametrize("frames", [900, 5])
def test_a_huge_pyspy_dump_is_read_bounded_and_kept_small(tmp_path: Path, frames: int) -> None:
    """300 threads of 900 frames made a 21 MB page; the names carried escape sequences."""
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!{sys.executable}\nimport sys\nout = sys.stdout.buffer\n"
                    "for t in range(300):\n"
                    "    out.write(b'Thread %d (idle): \"evil\\x1b]0;title\\x07%d\"\\n' % (t, t))\n"
                    f"    out.write(b'    wait (x.py:1)\\n' * {frames})\n")
    fake.chmod(0o755)
    threads, error = stacks.dump(os.getpid(), str(fake))
    assert error == ""
    if frames > stacks.MAX_FRAMES:  # the first 256 KiB hold a few threads, each cut to its innermost frames
        assert 0 < len(threads) < stacks.MAX_THREADS
        assert all(len(t.frames) == stacks.MAX_FRAMES and t.frames[0].wait for t in threads)
    else:
        assert len(threads) == stacks.MAX_THREADS and all(len(t.frames) == frames for t in threads)
    assert threads[0].name == "evil\\x1b]0;title\\x070"


def _pages(servers: list[SimpleNamespace]) -> StatusPages:
    runtime = SimpleNamespace(config=SimpleNamespace(web=SimpleNamespace(show_evidence=True)),
                              watcher=SimpleNamespace(servers=lambda: list(servers)))
    return StatusPages(runtime)  # type: ignore[arg-type]


def test_a_page_never_waits_for_another_servers_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    slow, quick = SimpleNamespace(name="slow"), SimpleNamespace(name="quick")
    entered, release = threading.Event(), threading.Event()

    def fake_stacks(processes: list[SimpleNamespace]) -> list[StackGroup]:
        if processes[0].pid == 1:  # the hostile server's py-spy round, 12 s in the audit
            entered.set()
            release.wait(30)
        return [StackGroup(["main"], [processes[0].pid], [], "")]

    monkeypatch.setattr(live, "stacks", fake_stacks)
    pages = _pages([slow, quick])
    hostile = threading.Thread(target=pages._stacks_of, args=(slow, [SimpleNamespace(pid=1)]))
    hostile.start()
    try:
        assert entered.wait(10)
        other = threading.Thread(target=pages._stacks_of, args=(quick, [SimpleNamespace(pid=2)]))
        other.start()
        other.join(5)
        assert not other.is_alive(), "the page waited for another server's py-spy round"
    finally:
        release.set()
        hostile.join(10)


def test_a_page_waits_a_bounded_time_for_its_own_servers_slow_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile tree's py-spy round runs py-spy's whole timeout: the page waits STACK_WAIT_SECONDS for it, shows
    the stacks taken before, and the next view, once the round ended, shows the new ones; reloads meanwhile start no
    second round."""
    rounds, release = [], threading.Event()

    def fake_stacks(processes: list[SimpleNamespace]) -> list[StackGroup]:
        rounds.append(processes[0].pid)
        if len(rounds) == 2:
            release.wait(30)
        return [StackGroup(["main"], [len(rounds)], [], "")]

    monkeypatch.setattr(live, "stacks", fake_stacks)
    monkeypatch.setattr(live, "STACK_TTL_SECONDS", 0.0)
    monkeypatch.setattr(live, "STACK_WAIT_SECONDS", 0.3)
    server = SimpleNamespace(name="hostile")
    pages = _pages([server])
    assert pages._stacks_of(server, [SimpleNamespace(pid=1)])[0].pids == [1]  # a quick round: waited for
    try:
        # The slow round blocks until `release`: a page that waited for it would see its stacks (2), not the last (1).
        assert pages._stacks_of(server, [SimpleNamespace(pid=1)])[0].pids == [1]
        assert pages._stacks_of(server, [SimpleNamespace(pid=1)])[0].pids == [1]
        assert len(rounds) == 2, "a reload started a second round beside the one under way"
    finally:
        release.set()
    poll(lambda: pages._stacks_of(server, [SimpleNamespace(pid=1)])[0].pids[0] >= 2, what="the slow round's stacks")


def test_stacks_of_a_forgotten_server_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "stacks", lambda processes: [StackGroup(["main"], [processes[0].pid], [], "")])
    servers = [SimpleNamespace(name="gone"), SimpleNamespace(name="kept")]
    pages = _pages(servers)
    for server in servers:
        pages._stacks_of(server, [SimpleNamespace(pid=7)])
    servers.pop(0)
    pages._stacks_of(servers[0], [SimpleNamespace(pid=7)])
    assert set(pages._stacks) == {"kept"}


# --- 9. an engine page is summed line by line, a family over the cap is a failed fetch ---------------------------


def _bomb(samples: int) -> str:
    spec = ENGINES["vllm"].metrics
    assert spec is not None
    return ("# TYPE vllm:num_requests_running gauge\n"
            + "".join(f'{spec.running}{{engine="{i}"}} 1\n' for i in range(samples))
            + f"{spec.waiting} 0\n{spec.tokens} 5\n")


def test_a_page_bomb_of_tiny_series_is_a_failed_fetch_and_costs_little() -> None:
    """A 4 MiB page of 95,574 samples cost about 45 MiB to parse, and its sum was exported."""
    spec = ENGINES["vllm"].metrics
    assert spec is not None
    assert parse_page(_bomb(MAX_SAMPLES), spec) == (MAX_SAMPLES, 0.0, 5.0)
    page = _bomb(95_574).encode()
    tracemalloc.start()
    with pytest.raises(ValueError, match=f"more than {MAX_SAMPLES} samples of vllm:num_requests_running"):
        parse_page(page, spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MiB"


def _reference(page: str, names: tuple[str, ...], same_over: tuple[str, ...]) -> list[float]:
    """The sums as prometheus_client's parser reads the page (the previous implementation)."""
    groups: dict[str, dict[tuple, float]] = {name: {} for name in names}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in groups and not math.isnan(sample.value):
                key = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in same_over))
                found = groups[sample.name]
                found[key] = max(found.get(key, sample.value), sample.value)
    return [sum(groups[name].values()) for name in names]


def test_page_sums_are_those_of_the_prometheus_parser() -> None:
    spec = ENGINES["sglang"].metrics
    assert spec is not None
    names = (spec.running, spec.waiting, spec.tokens)
    page = (f"# HELP {spec.running} Running requests, with a \\\\ and a \\n.\n# TYPE {spec.running} gauge\n"
            f'{spec.running}{{dp_rank="0",tp_rank="0",model="a \\"q\\" }} b"}} 3\n'
            f'{spec.running}{{dp_rank="0",tp_rank="1",model="a \\"q\\" }} b"}} 3\n'
            f'{spec.running}{{dp_rank="1",tp_rank="0",model="c,d=e"}} 2 1700000000000\n'
            f'{spec.running}{{dp_rank="2",tp_rank="0"}} NaN\n'
            f"{spec.running}_other_family 99\n"
            f"# TYPE {spec.waiting} gauge\n{spec.waiting} 1.5e0\n{spec.waiting}{{dp_rank=\"1\",}} +4\n"
            f"# TYPE sglang:generation_tokens counter\n{spec.tokens}{{dp_rank=\"0\"}} 100\n"
            f"{spec.tokens}{{dp_rank=\"1\"}} 2.5e2\nsglang:generation_tokens_created 1.7e9\n")
    expected = _reference(page, names, spec.same_over)
    assert expected == [5.0, 5.5, 350.0]
    assert list(parse_page(page, spec)) == expected
    with pytest.raises(ValueError, match="not a sample"):
        parse_page(page + f"{spec.tokens}{{dp_rank=\"2\" 7\n", spec)


# --- 15. Docker's json-file decoder keeps pieces of stdout and stderr only ---------------------------------------


def test_docker_records_of_other_streams_are_errors_and_keep_nothing() -> None:
    decoder = DockerJsonDecoder()
    forged = b"".join(json.dumps({"log": "x" * 1000, "stream": f"s{i}", "time": "t"}).encode() + b"\n"
                      for i in range(200))
    line = json.dumps({"log": "real\n", "stream": "stdout", "time": "t"}).encode() + b"\n"
    assert decoder.decode(forged + line) == b"real\n"
    assert decoder.errors == 200
    odd = json.dumps({"log": "y\n", "stream": ["stdout"], "time": "t"}).encode() + b"\n"
    assert decoder.decode(odd) == b"" and decoder.errors == 201


# --- 17. the status page says why the engine's /metrics failed -------------------------------------------------


def test_the_status_page_says_why_the_engines_page_failed(exporter, engine) -> None:
    sim = engine("llamacpp", transcripts.llamacpp_healthy(), final="serve", tp=1, args=("--metrics",),
                 work={"running": 1, "metrics": "hang"})
    e = exporter(config="discovery: {enabled: true, interval: 1s}\nengine_metrics: {interval: 0.3s, timeout: 1s}\n")

    def said() -> str:
        page = e.get(status_path(sim.name))[1]
        return page if "/metrics: timeout" in page else ""

    assert "engine figures: none" in poll(said, timeout=20, what="the page's error on the status page")
