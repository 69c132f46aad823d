"""The engine's own view (issue 13): requests running and waiting and tokens generated from each engine's
`/metrics` page and from its stats lines, and heartbeat lines that are not progress. Simulated engines serve the
real page formats and print the real stats lines; everything is read through the exporter's real endpoint."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.stats_lines import StatsLineIntegrator, last_stats
from stallwatch.signals.engine_page import MonotonicCounter, parse_page
from stallwatch.signals.probes import fetch
from support import transcripts
from support.harness import Exporter, Scrape
from support.paths import SIM_PKGS
from support.sandbox import Pod

sys.path.insert(0, str(SIM_PKGS))
import enginesim

CONFIG = ("discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
          "engine_metrics: {interval: 0.3s, timeout: 1s}\n")
BUSY = {"running": 8, "waiting": 2, "throughput": 400.0, "ranks": 2, "interval": 0.3}
HANG = {"running": 255, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.3}


def _value(scrape: Scrape, name: str, server: str, source: str | None = None) -> float | None:
    labels = {"server": server} if source is None else {"server": server, "source": source}
    return scrape.value(f"stallwatch_{name}", **labels)


def _page(engine: str, work: dict) -> str:
    return enginesim.Work(engine, work).page().decode()


# -- units: pages, counters, stats lines, heartbeats ---------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "llamacpp"])
def test_each_engines_page_sums_its_ranks(engine: str) -> None:
    spec = ENGINES[engine].metrics
    assert spec is not None
    running, waiting, tokens = parse_page(_page(engine, {**BUSY, "tokens_start": 1000, "throughput": 0.0}), spec)
    assert (running, waiting, tokens) == (8.0, 2.0, 1000.0)


def test_a_page_without_the_families_is_an_error() -> None:
    spec = ENGINES["vllm"].metrics
    assert spec is not None
    with pytest.raises(ValueError, match="vllm:num_requests_running"):
        parse_page("# TYPE other gauge\nother 1\n", spec)


def test_counter_keeps_what_an_engine_counted_before_its_restart() -> None:
    counter = MonotonicCounter()
    assert counter.update(100.0, "a") == 100.0
    assert counter.update(150.0, "a") == 150.0
    assert counter.update(10.0, "a") == 160.0  # restarted between fetches: the value dropped
    assert counter.update(500.0, "b") == 660.0  # a new process that already counted past the old value
    assert counter.update(510.0, "b") == 670.0


def test_last_stats_line_of_each_rank_read_back_from_the_end() -> None:
    sglang = ENGINES["sglang"].stats_lines[0]
    block = "".join(transcripts.sglang_decode(2000)).encode()
    assert last_stats(block, sglang) == {b"": ((1999 % 48) + 1, 0, 1873.44)}
    two = "".join(enginesim._sglang_stats(f"10:00:0{i}", rank, 3 + i, rank, 50.0, 2)
                  for i in range(3) for rank in range(2)).encode()
    assert last_stats(two, sglang) == {b"": (5, 0, 50.0), b"1": (5, 1, 50.0)}
    vllm = ENGINES["vllm"].stats_lines[0]
    assert last_stats(transcripts.vllm_post_ready_hang().encode(), vllm) == {b"": (255, 0, 0.0)}
    v0 = (b"INFO 01-31 10:29:02 metrics.py:467] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
          b"31.2 tokens/s, Running: 3 reqs, Swapped: 0 reqs, Pending: 4 reqs, GPU KV cache usage: 1.1%, CPU KV "
          b"cache usage: 0.0%.\n")
    assert last_stats(v0, vllm) == {b"": (3, 4, 31.2)}


def test_log_tokens_integrate_throughput_between_lines_capped_at_the_window() -> None:
    stats = StatsLineIntegrator(ENGINES["vllm"].stats_lines)
    line = transcripts._vllm_stats("09:05:00", 4, 1, 100.0).encode()
    stats.feed(line, 1000.0)  # the first line covers its own window: 10 s
    stats.feed(line, 1005.0)
    stats.feed(line, 2000.0)  # idle in between (no lines): one window, not 995 s
    figures = stats.figures()
    assert figures is not None
    assert (figures.running, figures.waiting, figures.tokens, figures.at) == (4.0, 1.0, 2500.0, 2000.0)


def test_a_relaunch_keeps_the_log_tokens_and_drops_the_old_ranks() -> None:
    now = [1000.0]
    interpreter = LogInterpreter(ENGINES["vllm"], wall=lambda: now[0])
    interpreter.feed(transcripts.vllm_post_ready_hang(1).replace("0.0 tokens/s, Running", "50.0 tokens/s, Running")
                 .encode())
    before = interpreter.figures()
    assert before is not None and before.running == 255 and before.tokens == 500.0
    now[0] = 1100.0
    interpreter.process_started(1099.0)
    after = interpreter.figures()
    assert after is not None and (after.running, after.tokens) == (0.0, 500.0)


def test_heartbeats_do_not_move_last_progress() -> None:
    now = [1000.0]
    interpreter = LogInterpreter(ENGINES["tgi"], wall=lambda: now[0])
    assert interpreter.progress() is None
    interpreter.feed(transcripts.tgi_healthy().split("Waiting for shard")[0].rsplit("\n", 1)[0].encode() + b"\n")
    assert interpreter.progress() == 1000.0
    now[0] = 2200.0
    interpreter.feed(transcripts.tgi_shard_stuck(1200).split("rank=1\n", 2)[2].encode())
    assert interpreter.progress() == 1000.0  # 20 minutes of nothing but the wait loop's notice
    interpreter.feed(b"2026-11-20T09:20:05.170897Z  INFO shard-manager: text_generation_launcher: Shard ready in "
                 b"1201.2s rank=0\n")
    assert interpreter.progress() == 2200.0
    vllm = LogInterpreter(ENGINES["vllm"], wall=lambda: now[0])
    vllm.feed(transcripts.vllm_shm_stall().split("No available shared")[0].rsplit("\n", 1)[0].encode() + b"\n")
    now[0] = 2500.0
    vllm.feed(transcripts.vllm_shm_stall().rsplit("\n", 4)[1].encode() + b"\n")
    assert vllm.progress() == 2200.0


@pytest.fixture
def page_server() -> Iterator[Callable[[bytes], str]]:
    servers: list[ThreadingHTTPServer] = []

    def serve(body: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def test_fetch_caps_the_body(page_server: Callable[[bytes], str]) -> None:
    result, body = fetch(page_server(b"x" * 1000), 2.0, 1000)
    assert result.success and body == b"x" * 1000
    result, body = fetch(page_server(b"x" * 1001), 2.0, 1000)
    assert result.success and body is None


# -- through the exporter ------------------------------------------------------------------------------------------


def test_busy_vllm_from_its_page_and_its_stats_lines(exporter, engine) -> None:
    sim = engine("vllm", transcripts.vllm_healthy(), final="serve", tp=2, work=BUSY)
    e: Exporter = exporter(config=CONFIG)

    def busy(s: Scrape) -> Scrape | None:
        return s if (_value(s, "engine_metrics_up", sim.name) == 1
                and _value(s, "engine_requests_running", sim.name, "metrics") == 8
                and _value(s, "engine_requests_waiting", sim.name, "metrics") == 2
                and _value(s, "engine_requests_running", sim.name, "log") == 8
                and _value(s, "engine_requests_waiting", sim.name, "log") == 2) else None

    first = e.wait_for(busy, what="busy figures from both sources")
    later = e.wait_for(lambda s: all((_value(s, "engine_generated_tokens_total", sim.name, src) or 0)
                                     > (_value(first, "engine_generated_tokens_total", sim.name, src) or 0)
                                     for src in ("metrics", "log")) and s, what="tokens to grow")
    stamp = _value(later, "engine_stats_timestamp_seconds", sim.name, "metrics")
    assert stamp is not None and abs(stamp - time.time()) < 10


def test_idle_vllm_reports_zero_and_prints_no_stats(exporter, engine) -> None:
    sim = engine("vllm", transcripts.vllm_healthy(), final="serve", tp=2,
                 work={"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 42})
    e = exporter(config=CONFIG)
    s = e.wait_for(lambda s: _value(s, "engine_metrics_up", sim.name) == 1
                   and _value(s, "engine_generated_tokens_total", sim.name, "metrics") == 42 and s,
                   what="idle figures")
    assert _value(s, "engine_requests_running", sim.name, "metrics") == 0
    assert _value(s, "engine_requests_running", sim.name, "log") is None  # vLLM logs idle stats at DEBUG


def test_post_ready_hang_health_passes_running_255_tokens_frozen(exporter, engine) -> None:
    """vLLM #23378: `/health` 200 forever, `Running: 255 reqs`, `Avg generation throughput: 0.0 tokens/s`."""
    sim = engine("vllm", transcripts.vllm_post_ready_hang(), final="serve", tp=2, work=HANG)
    e = exporter(config=CONFIG)

    def hung(s: Scrape) -> Scrape | None:
        return s if (_value(s, "engine_requests_running", sim.name, "metrics") == 255
                and _value(s, "engine_requests_running", sim.name, "log") == 255
                and s.value("stallwatch_startup_phase", server=sim.name, phase="serving") == 1) else None

    first = e.wait_for(hung, what="the hang's figures")
    time.sleep(1.0)  # several fetches and stats lines later
    later = e.scrape()
    for source in ("metrics", "log"):
        tokens = _value(later, "engine_generated_tokens_total", sim.name, source)
        assert tokens == _value(first, "engine_generated_tokens_total", sim.name, source), source
    assert _value(later, "engine_generated_tokens_total", sim.name, "metrics") == 5000
    assert (_value(later, "engine_stats_timestamp_seconds", sim.name, "log") or 0) > (
        _value(first, "engine_stats_timestamp_seconds", sim.name, "log") or 0)


def test_hanging_llamacpp_metrics_is_down_and_the_exporter_keeps_serving(exporter, engine) -> None:
    sim = engine("llamacpp", transcripts.llamacpp_healthy(), final="serve", tp=1, args=("--metrics",),
                 work={"running": 1, "metrics": "hang"})
    e = exporter(config=CONFIG)
    e.wait_for(lambda s: _value(s, "engine_metrics_up", sim.name) == 0, what="metrics_up 0")
    start = time.monotonic()
    for _ in range(5):
        assert e.scrape().value("stallwatch_collector_success", collector="engine_metrics") == 1
    assert time.monotonic() - start < 2.0


def test_page_over_the_cap_is_a_failed_fetch(exporter, engine) -> None:
    sim = engine("vllm", transcripts.vllm_healthy(), final="serve", tp=1,
                 work={"running": 1, "pad_bytes": 5 << 20})
    e = exporter(config=CONFIG)
    s = e.wait_for(lambda s: _value(s, "engine_metrics_up", sim.name) == 0 and s, timeout=20, what="metrics_up 0")
    assert _value(s, "engine_requests_running", sim.name, "metrics") is None


def test_counter_never_goes_down_across_an_engine_restart(exporter, engine) -> None:
    first = engine("vllm", transcripts.vllm_healthy(), final="serve", tp=1,
                   work={"running": 1, "tokens_start": 1000})
    e = exporter(config=CONFIG)
    e.wait_for(lambda s: _value(s, "engine_generated_tokens_total", first.name, "metrics") == 1000, what="1000")
    first.stop()
    second = engine("vllm", transcripts.vllm_healthy(), final="serve", tp=1, port=first.port,
                    work={"running": 1, "tokens_start": 10})
    assert second.name == first.name
    e.wait_for(lambda s: _value(s, "engine_generated_tokens_total", first.name, "metrics") == 1010,
               timeout=20, what="1000 kept, 10 added")


def test_sglang_page_only_with_enable_metrics_and_stats_from_the_log(exporter, engine) -> None:
    work = {**BUSY, "throughput": 0.0, "tokens_start": 300}
    off = engine("sglang", transcripts.sglang_healthy(2), final="serve", tp=2, work=work)
    on = engine("sglang", transcripts.sglang_healthy(2), final="serve", tp=2, work=work,
                args=("--enable-metrics",))
    e = exporter(config=CONFIG)
    s = e.wait_for(lambda s: _value(s, "engine_requests_running", off.name, "log") == 8
                   and _value(s, "engine_requests_waiting", off.name, "log") == 2
                   and _value(s, "engine_requests_running", on.name, "metrics") == 8 and s,
                   what="sglang figures")
    assert _value(s, "engine_metrics_up", off.name) is None  # no page without --enable-metrics
    assert _value(s, "engine_requests_running", off.name, "metrics") is None
    assert _value(s, "engine_generated_tokens_total", on.name, "metrics") == 300


def test_tgi_stuck_waiting_for_shards_makes_no_progress(exporter, engine) -> None:
    sim = engine("tgi", transcripts.tgi_shard_stuck(1200), final="stall", tp=2, line_delay=0.02)
    e = exporter(config=CONFIG)

    def grown_past(since: float) -> Callable[[Scrape], Scrape | None]:
        def check(s: Scrape) -> Scrape | None:
            last = max((x.value for x in s.samples("stallwatch_log_last_line_timestamp_seconds")
                        if x.labels["server"] == sim.name), default=0.0)
            progress = _value(s, "log_last_progress_timestamp_seconds", sim.name)
            return s if progress is not None and last > max(since, progress) + 1.0 else None
        return check

    s = e.wait_for(grown_past(0.0), what="heartbeats after the launch lines")
    progress = _value(s, "log_last_progress_timestamp_seconds", sim.name)
    assert progress is not None
    later = e.wait_for(grown_past(progress + 1.0), what="more heartbeats")
    assert _value(later, "log_last_progress_timestamp_seconds", sim.name) == progress


@pytest.mark.root
def test_stats_lines_and_page_of_a_vllm_in_a_cri_pod(exporter, tmp_path: Path) -> None:
    """In a pod: the stats lines come through containerd's CRI log (framing removed), the page from the pod IP."""
    with Pod(tmp_path, "vllm", transcripts.vllm_healthy(tp=1), namespace="llm", pod="busy-0", final="serve", tp=1,
             port=8000, host="0.0.0.0", work=BUSY):
        e = exporter(config=CONFIG, args=(f"--path.rootfs={tmp_path / 'root'}",))

        def figures(s: Scrape) -> Scrape | None:
            return s if all(_value(s, "engine_requests_running", "llm/busy-0", source) == 8
                            and (_value(s, "engine_generated_tokens_total", "llm/busy-0", source) or 0) > 0
                            for source in ("metrics", "log")) else None

        s = e.wait_for(figures, timeout=30, what="figures of the pod from its page and its CRI log")
        assert _value(s, "engine_requests_waiting", "llm/busy-0", "log") == 2
        assert _value(s, "engine_metrics_up", "llm/busy-0") == 1


def test_a_page_with_values_that_are_not_finite_is_refused() -> None:
    from stallwatch.engines import ENGINES
    from stallwatch.signals.engine_page import parse_page

    spec = ENGINES["vllm"].metrics
    assert spec is not None
    page = (f"# TYPE {spec.running} gauge\n{spec.running} +Inf\n# TYPE {spec.waiting} gauge\n{spec.waiting} 0\n"
            f"# TYPE {spec.tokens} counter\n{spec.tokens} 12\n")
    with pytest.raises(ValueError, match="not finite"):
        parse_page(page, spec)
