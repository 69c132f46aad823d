"""Pending PD requests from batch lines (the real lines of SGLang's PD servers and vLLM's KV consumer), and the
`kv_transfer_failure` event from each side's failure lines."""

from __future__ import annotations

import pytest

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from support.sim import enginesim
from support.transcripts import REAL_LOGS

# Real lines (research/disaggregation.md section 1.3; sglang's `metrics_reporter.py` formats with DP ranks).
PREFILL = (b"[2026-09-24 01:47:50.615 DP3 TP3 EP3] Prefill batch [1], #new-seq: 1, #new-token: 64, #cached-token: 0, "
           b"token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, #bootstrap-req: 2, "
           b"#inflight-req: 1, #optimistic-req: 0, cuda graph: False, input throughput (token/s): 7.29\n")
DECODE = (b"[2026-09-24 01:50:43.001 DP0 TP0 EP0] Decode batch [40], #running-req: 1, #token: 532160, token usage: "
          b"0.19, accept len: 4.40, accept rate: 0.68, pre-allocated usage: 0.18, #prealloc-req: 0, #transfer-req: 22, "
          b"#retracted-req: 0, cuda graph: True, gen throughput (token/s): 11.87, #queue-req: 0\n")


def _interpreter(engine: str, role: str) -> LogInterpreter:
    interpreter = LogInterpreter(ENGINES[engine])
    interpreter.track_pending(role)
    return interpreter


def test_each_ranks_last_line_counts_and_each_role_reads_its_own_lines() -> None:
    prefill = _interpreter("sglang", "prefill")
    prefill.feed(PREFILL + PREFILL.replace(b"DP3", b"DP1").replace(b"#bootstrap-req: 2", b"#bootstrap-req: 5") + DECODE)
    assert prefill.snapshot().pending == {"bootstrap": 7, "inflight": 2}
    decode = _interpreter("sglang", "decode")
    decode.feed(PREFILL + DECODE)
    assert decode.snapshot().pending == {"prealloc": 0, "transfer": 22}


def test_a_server_that_is_no_pd_member_reads_no_pending_lines() -> None:
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.feed(PREFILL + DECODE)
    assert interpreter.snapshot().pending is None


def test_vllm_kv_fetch_stages_from_its_stats_line() -> None:
    interpreter = _interpreter("vllm", "decode")
    interpreter.feed(b"(APIServer pid=1) INFO 11-20 10:00:00 [loggers.py:276] Engine 000: Avg prompt throughput: 0.0 "
                     b"tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 4 reqs, GPU KV "
                     b"cache usage: 1.0%, Prefix cache hit rate: 0.0%, KV fetch: 1 waiting to start, 3 in progress, 0 "
                     b"completed waiting\n")
    assert interpreter.snapshot().pending == {"prealloc": 1, "transfer": 3}


@pytest.mark.parametrize(("name", "line"), [
    ("sglang", b"[2026-11-20 10:00:00 TP0] Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 3 "
               b"requests affected\n"),
    ("sglang", b"[2025-09-17 16:23:13 TP1] Decode transfer failed for request rank=1 decode_req.req.rid='a1' "
               b"decode_req.req.bootstrap_room=17 with exception KVTransferError(bootstrap_room=17): Failed due to an "
               b"unknown reason from another rank\n"),
    ("sglang", b"[2026-11-20 10:00:00 TP0] Prefill bootstrap failed for request rank=0 req.rid='b2' "
               b"req.bootstrap_room=9 with exception KVTransferError(bootstrap_room=9): Request 9 timed out after "
               b"300.0s in KVPoll.Bootstrapping\n"),
    ("sglang", b"[2026-11-20 10:00:00 TP0] Session 10.0.0.2:17000 failed.\n"),
    ("vllm", b"(EngineCore_DP0 pid=9) ERROR 11-20 10:00:00 [base_worker.py:1335] NIXL transfer failure: "
             b"transfer_failed | Context: {'remote_engine_id': 'e1'}\n"),
])
def test_a_failed_kv_transfer_is_an_event_once_serving(name: str, line: bytes) -> None:
    interpreter = LogInterpreter(ENGINES[name])
    interpreter.feed(line)
    assert interpreter.snapshot().events["kv_transfer_failure"] == 1


def test_the_decode_sides_reconnect_attempts_are_heartbeats_not_progress() -> None:
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.feed(b"[2026-11-20 10:00:00 TP0] Attempting to reconnect to 10.0.0.1:8998...\n")
    assert interpreter.snapshot().progress is None


def test_a_published_pd_decode_log_gives_each_dp_ranks_pending_stages() -> None:
    """A real SGLang PD decode head's log (tests/fixtures/logs/SOURCES.md: Ascend, DP16 with DP attention, its
    `Decode batch, ..., #prealloc-req: 0, #transfer-req: 0, ...` lines per DP rank, `npu graph` wording)."""
    interpreter = _interpreter("sglang", "decode")
    data = (REAL_LOGS / "sglang-ascend-pd-decode-retract-crash.log").read_bytes()
    for line in data.splitlines(keepends=True):
        interpreter.feed(line)
    assert interpreter.snapshot().pending == {"prealloc": 0, "transfer": 0}
    lines = [line for line in data.splitlines() if b"#transfer-req: " in line]
    assert lines and all(b"Decode batch" in line for line in lines)


@pytest.mark.parametrize(("role", "stages"), [("prefill", {"bootstrap": 3, "inflight": 1}),
                                              ("decode", {"prealloc": 4, "transfer": 5})])
def test_the_simulated_pd_batch_lines_are_read_as_the_real_ones(role: str, stages: dict[str, int]) -> None:
    work = enginesim.Work("sglang", {"running": 2, "waiting": 1, "throughput": 10.0,
                                     "pending": {"bootstrap": 3, "inflight": 1, "prealloc": 4, "transfer": 5}}, role)
    interpreter = _interpreter("sglang", role)
    interpreter.feed(work.stats_lines().encode())
    assert interpreter.snapshot().pending == stages
