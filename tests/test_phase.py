"""Startup phases and events from the engines' real log lines (tests/support/transcripts.py)."""

from __future__ import annotations

from stallwatch.engines import ENGINES
from stallwatch.engines.base import rule
from stallwatch.logs.interpret import LogInterpreter
from support import transcripts as t


def phases(engine: str, text: str, interpreter: LogInterpreter | None = None) -> list[str]:
    """The phase sequence, feeding one line (or one tqdm update) at a time."""
    interpreter = interpreter or LogInterpreter(ENGINES[engine])
    seen: list[str] = []
    for line in text.encode().splitlines(keepends=True):
        for part in line.split(b"\r"):
            interpreter.feed(part + b"\n")
            phase = interpreter.snapshot().phase
            if not seen or seen[-1] != phase:
                seen.append(phase)
    return seen[1:] if seen[0] == "stopped" else seen


def run(engine: str, text: str) -> LogInterpreter:
    interpreter = LogInterpreter(ENGINES[engine])
    interpreter.feed(text.encode())
    return interpreter


def test_sglang_eagle3_healthy_startup() -> None:
    assert phases("sglang", t.sglang_healthy()) == [
        "launching", "loading_weights", "allocating_memory", "capturing_graphs",
        "loading_weights", "allocating_memory", "capturing_graphs",  # the EAGLE3 draft model and its graphs
        "warming_up", "serving",
    ]


def test_sglang_stall_after_last_shard() -> None:
    interpreter = run("sglang", t.sglang_until_shards(tp=8, shards=64))
    phase, _, loaded, total, events = interpreter.snapshot()
    assert (phase, loaded, total) == ("loading_weights", 64, 64)
    assert sum(events.values()) == 0


def test_sglang_shard_progress_is_followed() -> None:
    interpreter = LogInterpreter(ENGINES["sglang"])
    text = t.sglang_until_shards(tp=2, shards=8).encode()
    cut = text.index(b"| 4/8") + 10
    interpreter.feed(text[: text.rfind(b"\r", 0, cut)])
    snap = interpreter.snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == (3, 8)


def test_sglang_older_wording() -> None:
    text = ("[2025-01-23 19:30:01 TP0] Init torch distributed begin.\n"
            "[2025-01-23 19:30:05 TP0] Load weight begin. avail mem=78.50 GB\n"
            "[2025-01-23 19:31:05 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, "
            "avail mem=24.71 GB, mem usage=14.00 GB.\n"
            "[2025-01-23 19:31:06 TP0] KV Cache is allocated. #tokens: 10240, K size: 0.47 GB, V size: 0.47 GB\n"
            "[2025-01-23 19:31:06 TP0] Capture cuda graph begin. This can take up to several minutes. "
            "avail mem=2.98 GB\n"
            "[2025-01-23 19:31:08 TP0] Capture cuda graph end. Time elapsed: 1.24 s. mem usage=0.09 GB.\n"
            "[2025-01-23 19:35:27] INFO:     Started server process [889167]\n"
            "[2025-01-23 19:35:30] The server is fired up and ready to roll!\n"
            "[2025-01-23 19:36:30 TP0] Decode batch. #running-req: 1, #token: 92, token usage: 0.00\n")
    assert phases("sglang", text) == ["launching", "loading_weights", "allocating_memory", "capturing_graphs",
                                      "warming_up", "serving"]


def test_sglang_crash_during_graph_capture() -> None:
    interpreter = run("sglang", t.sglang_graph_crash())
    phase, _, _, _, events = interpreter.snapshot()
    assert phase == "failed"
    assert events["fatal"] == 3  # scheduler exception, capture failure, the launcher's sigquit notice
    assert events["oom"] == 1
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "failed"


def test_sglang_nccl_watchdog_timeout() -> None:
    interpreter = run("sglang", t.sglang_nccl_timeout())
    phase, _, _, _, events = interpreter.snapshot()
    assert phase == "serving"
    assert events["nccl_timeout"] == 2 and events["fatal"] == 1
    interpreter.process_gone()  # the C++ abort took the process down
    assert interpreter.snapshot().phase == "failed"


def test_sglang_serving_then_idle_stays_serving() -> None:
    interpreter = run("sglang", t.sglang_healthy() + "".join(t.sglang_decode(100)))
    assert interpreter.snapshot().phase == "serving"
    interpreter.feed(b"[2026-11-20 09:20:57] Load weight begin. avail mem=1.00 GB\n")  # e.g. a weight update
    assert interpreter.snapshot().phase == "serving"


def test_relaunch_in_same_log_counts_restart_and_resets_shards() -> None:
    interpreter = run("sglang", t.sglang_graph_crash(tp=2) + t.sglang_until_shards(tp=2, shards=4)[:400])
    phase, _, loaded, _, events = interpreter.snapshot()
    assert phase in ("launching", "loading_weights") and loaded is None
    assert events["server_restart"] == 1


def test_vllm_0_33_healthy_startup() -> None:
    assert phases("vllm", t.vllm_healthy()) == [  # torch.compile (Dynamo) is part of the profile run
        "launching", "loading_weights", "allocating_memory", "capturing_graphs", "warming_up", "serving",
    ]
    snap = run("vllm", t.vllm_healthy()).snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == (30, 30)


def test_vllm_shared_memory_stall_warning_repeats() -> None:
    interpreter = run("vllm", t.vllm_shm_stall(repeats=3))
    assert interpreter.snapshot().phase == "serving"
    assert interpreter.snapshot().events["stall_warning"] == 3


def test_vllm_0_11_prefix_with_ansi_colours() -> None:
    assert phases("vllm", t.vllm_0_11_ansi()) == ["launching", "loading_weights", "allocating_memory"]


def test_vllm_v0_format() -> None:
    assert phases("vllm", t.vllm_v0()) == ["launching", "loading_weights", "allocating_memory",
                                           "capturing_graphs"]


def test_vllm_engine_core_failure() -> None:
    text = t.vllm_healthy()[:2000] + (
        "(EngineCore pid=525790) ERROR 11-20 09:00:30 [core.py:1584] EngineCore failed to start.\n"
        "(EngineCore pid=525790) ERROR 11-20 09:00:30 [core.py:1584] Traceback (most recent call last):\n"
        "(EngineCore pid=525790) ERROR 11-20 09:00:30 [core.py:1584] torch.OutOfMemoryError: CUDA out of memory.\n")
    interpreter = run("vllm", text)
    phase, _, _, _, events = interpreter.snapshot()
    assert phase == "failed" and events["fatal"] == 2 and events["oom"] == 1


def test_tgi_startup_and_shard_crash() -> None:
    assert phases("tgi", t.tgi_healthy()) == ["launching", "loading_weights", "warming_up", "capturing_graphs",
                                              "warming_up", "serving"]
    interpreter = run("tgi", t.tgi_shard_crash())
    assert interpreter.snapshot().phase == "failed" and interpreter.snapshot().events["fatal"] == 2


def test_llamacpp_startup_and_load_error() -> None:
    assert phases("llamacpp", t.llamacpp_healthy()) == ["launching", "loading_weights", "allocating_memory",
                                                        "warming_up", "serving"]
    assert run("llamacpp", t.llamacpp_load_error()).snapshot().phase == "failed"


def test_generic_engine_rules_from_config() -> None:
    engine = ENGINES["generic"].with_rules([rule("booting my-server", phase="launching"),
                                            rule("weights ready", phase="warming_up"),
                                            rule("accepting requests", phase="serving"),
                                            rule("PANIC:", event="fatal")])
    interpreter = LogInterpreter(engine)
    interpreter.feed(b"booting my-server v2\nweights ready\naccepting requests\nPANIC: disk full\n")
    assert interpreter.snapshot().phase == "serving" and interpreter.snapshot().events["fatal"] == 1


def test_probe_success_means_serving_and_process_gone_means_stopped() -> None:
    clock = iter(range(100, 200))
    interpreter = LogInterpreter(ENGINES["llamacpp"], wall=lambda: float(next(clock)))
    interpreter.process_started(create_time=99.0)
    assert interpreter.snapshot().phase == "launching"
    interpreter.probe_succeeded(at=50.0)  # older than the launch: does not count
    assert interpreter.snapshot().phase == "launching"
    interpreter.probe_succeeded(at=150.0)
    assert interpreter.snapshot().phase == "serving"
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "stopped"
    interpreter.process_started(create_time=170.0)
    assert interpreter.snapshot().phase == "launching" and interpreter.snapshot().events["server_restart"] == 1


def test_events_counted_once_per_line() -> None:
    interpreter = run("sglang", "[2026-11-20 09:19:52 TP3] Scheduler hit an exception: Traceback (most recent "
                  "call last): Traceback (most recent call last)\n")
    assert interpreter.snapshot().events["fatal"] == 1


def test_rule_without_literal_still_matches() -> None:
    engine = ENGINES["generic"].with_rules([rule(r"^\d{3} ready$", phase="serving"),
                                            rule(r"(?i)panic:", event="fatal")])
    interpreter = LogInterpreter(engine)
    interpreter.feed(b"noise\n200 ready\nPanic: disk full\n")
    assert interpreter.snapshot().phase == "serving"
    assert interpreter.snapshot().events["fatal"] == 1


def test_routine_lines_are_skipped_once_serving_but_never_hide_an_event() -> None:
    interpreter = run("sglang", t.sglang_healthy(tp=1))
    assert interpreter.snapshot().phase == "serving"
    decode = list(t.sglang_decode(3))
    interpreter.feed("".join([*decode, "[broken line without a bracket\n", *decode,
                          "[2026-11-20 10:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):\n",
                          *decode]).encode())
    snap = interpreter.snapshot()
    assert snap.phase == "failed" and snap.events["fatal"] == 1
