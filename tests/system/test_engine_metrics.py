"""The engine's own view through the exporter: requests running and waiting and tokens generated from each engine's
page and stats lines."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from stallwatch.engines import ENGINES
from stallwatch.signals.engine_page import parse_page
from support import transcripts
from support.harness import Exporter, Scrape
from support.sim import enginesim

CONFIG = ("discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
          "engine_metrics: {interval: 0.3s, timeout: 1s}\n")


BUSY = {"running": 8, "waiting": 2, "throughput": 400.0, "ranks": 2, "interval": 0.3}


HANG = {"running": 255, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.3}


def _value(scrape: Scrape, name: str, server: str, source: str | None = None) -> float | None:
    labels = {"server": server} if source is None else {"server": server, "source": source}
    return scrape.value(f"stallwatch_{name}", **labels)


def _page(engine: str, work: dict) -> str:
    return enginesim.Work(engine, work).page().decode()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "tgi", "llamacpp", "trtllm"])
def test_each_engines_page_sums_its_ranks(engine: str) -> None:
    spec = ENGINES[engine].metrics
    assert spec is not None
    running, waiting, tokens = parse_page(_page(engine, {**BUSY, "tokens_start": 1000, "throughput": 0.0}), spec)
    assert (running, waiting, tokens) == (8.0, 2.0, 1000.0)


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
    assert time.monotonic() - start < 5.0  # five scrapes that waited for the 1 s fetch timeout would take more


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
