"""Engines' periodic stats lines: the last one of each rank read back, tokens integrated between lines."""

from __future__ import annotations

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.stats_lines import StatsLineIntegrator, last_stats
from support import transcripts
from support.sim import enginesim


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
    before = interpreter.snapshot().figures
    assert before is not None and before.running == 255 and before.tokens == 500.0
    now[0] = 1100.0
    interpreter.process_started(1099.0)
    after = interpreter.snapshot().figures
    assert after is not None and (after.running, after.tokens) == (0.0, 500.0)


def test_heartbeats_do_not_move_last_progress() -> None:
    now = [1000.0]
    interpreter = LogInterpreter(ENGINES["tgi"], wall=lambda: now[0])
    assert interpreter.snapshot().progress is None
    interpreter.feed(transcripts.tgi_healthy().split("Waiting for shard")[0].rsplit("\n", 1)[0].encode() + b"\n")
    assert interpreter.snapshot().progress == 1000.0
    now[0] = 2200.0
    interpreter.feed(transcripts.tgi_shard_stuck(1200).split("rank=1\n", 2)[2].encode())
    assert interpreter.snapshot().progress == 1000.0  # 20 minutes of nothing but the wait loop's notice
    interpreter.feed(b"2026-11-20T09:20:05.170897Z  INFO shard-manager: text_generation_launcher: Shard ready in "
                 b"1201.2s rank=0\n")
    assert interpreter.snapshot().progress == 2200.0
    vllm = LogInterpreter(ENGINES["vllm"], wall=lambda: now[0])
    vllm.feed(transcripts.vllm_shm_stall().split("No available shared")[0].rsplit("\n", 1)[0].encode() + b"\n")
    now[0] = 2500.0
    vllm.feed(transcripts.vllm_shm_stall().rsplit("\n", 4)[1].encode() + b"\n")
    assert vllm.snapshot().progress == 2200.0
