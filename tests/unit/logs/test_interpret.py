"""The log interpreter: each engine's real lines move the phase (startup, shards, serving, stalls, crashes, stops),
launches and restarts are counted, and its scans stay bounded on hostile logs."""

from __future__ import annotations

import time

import pytest

from stallwatch.engines import ENGINES
from stallwatch.engines.base import rule
from stallwatch.logs import interpret
from stallwatch.logs.interpret import LogInterpreter
from support import transcripts
from support import transcripts as t
from support.feeding import fed, phase_steps

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


def ends(interpreter: LogInterpreter) -> tuple[str, int]:
    """The phase once the main process is gone, and the fatal events counted."""
    interpreter.process_gone()
    snap = interpreter.snapshot()
    return snap.phase, snap.events["fatal"]


def _phase_of(engine: str, log: str, worker: bool) -> LogInterpreter:
    chosen = ENGINES[engine].as_worker() if worker else ENGINES[engine]
    interpreter = LogInterpreter(chosen)
    interpreter.feed(log.encode())
    return interpreter


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


@pytest.mark.parametrize("end", [b"\n", b"\r"])
def test_line_bounds_look_at_each_byte_a_bounded_number_of_times(end: bytes) -> None:
    """Each hit's line was found by searching for `\\r` to the block's ends: a thousand looks at each byte."""
    stats = b"".join(b"[2026-11-20 10:00:00 DP%d TP0] Decode batch, #running-req: 1, #token: 4096, cuda graph: True, "
                     b"gen throughput (token/s): 10.00, #queue-req: 0\n" % rank for rank in range(64))
    block = Scanned(TRACEBACK.replace(b"\n", end) * 2000 + b"\n" + stats)
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.feed(block)
    assert interpreter.snapshot().events["fatal"] == 2000
    figures = interpreter.snapshot().figures  # the stats line of each DP rank, read back from the end
    assert figures is not None and figures.running == 64
    assert block.looked < 4 * len(block), f"{block.looked / len(block):.0f} looks a byte"


def test_a_block_of_nothing_but_notable_lines_is_cut_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log of nothing but `Traceback` lines made the interpreter run the rules in Python for every line of a block,
    so one hostile file stalled the only log thread for minutes (docs/research/audit-2026-12-01.md #7). At most
    MAX_CANDIDATE_LINES lines of a block are interpreted (100 here: 100 fatal events of 1,000 lines), and the next
    block is read as usual."""
    monkeypatch.setattr(interpret, "MAX_CANDIDATE_LINES", 100)
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.feed(TRACEBACK * 1000)
    assert interpreter.snapshot().events["fatal"] == 100
    interpreter.feed(LAUNCH)  # the next block is read again
    assert interpreter.snapshot().phase == "launching"


def test_heartbeat_blocks_are_judged_without_a_python_loop_over_lines() -> None:
    """A log of TGI heartbeat lines made the interpreter loop over `splitlines()` in Python to tell progress from
    heartbeats, at 0.2 MB/s (docs/research/audit-2026-12-01.md #7). A block of heartbeats is judged with no
    `splitlines` call and is not progress, and a block with one other line is."""
    now = [1000.0]
    interpreter = LogInterpreter(ENGINES["tgi"], wall=lambda: now[0])
    beats = transcripts.tgi_shard_stuck(1200).split("rank=1\n", 2)[2].encode()
    block = Scanned(beats * 40)
    interpreter.feed(block)
    assert interpreter.snapshot().progress is None and block.splits == 0
    now[0] = 1010.0
    interpreter.feed(Scanned(beats + b"2026-11-20T09:20:05Z  INFO shard-manager: Shard ready in 1201.2s rank=0\n"))
    assert interpreter.snapshot().progress == 1010.0


@pytest.mark.parametrize("stop", ["sglang-sigterm-stop.log", "sglang-sigterm-group-stop.log"])
def test_sglang_sigterm_stop_is_stopped_without_a_fatal_event(stop: str) -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"), t.real(stop))
    assert interpreter.snapshot().phase == "serving"  # draining, until the process is gone
    assert ends(interpreter) == ("stopped", 0)


def test_sglang_crash_while_serving_still_fails() -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"), t.real("sglang-crash-while-serving.log"))
    assert interpreter.snapshot().phase == "failed"
    phase, fatal = ends(interpreter)
    assert phase == "failed" and fatal >= 2  # the scheduler's exception, the child's exit code -3, SIGQUIT


def test_a_stop_after_a_crash_is_still_a_failure() -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"), t.real("sglang-crash-while-serving.log"),
                      t.real("sglang-sigterm-stop.log"))
    assert ends(interpreter)[0] == "failed"


@pytest.mark.parametrize("stop", ["vllm-0.15-sigterm-stop.log", "vllm-0.16-sigterm-stop-tp2.log",
                                  "vllm-0.24-sigint-stop.log"])
def test_vllm_stop_is_stopped_without_a_fatal_event(stop: str) -> None:
    interpreter = fed("vllm", t.vllm_healthy(), t.real(stop))
    assert ends(interpreter) == ("stopped", 0)


def test_vllm_engine_core_death_while_serving_fails() -> None:
    interpreter = fed("vllm", t.vllm_healthy(), t.real("vllm-0.11-engine-death.log"))
    assert interpreter.snapshot().phase == "failed"
    assert ends(interpreter)[0] == "failed"


def test_tgi_graceful_stop_is_stopped_and_a_shard_crash_fails() -> None:
    assert ends(fed("tgi", t.tgi_healthy(), t.real("tgi-graceful-stop.log"))) == ("stopped", 0)
    crashed = fed("tgi", t.tgi_healthy(), t.real("tgi-shard-crash.log"), t.real("tgi-shard-shutdown-tail.log"))
    assert ends(crashed)[0] == "failed"


def test_llamacpp_stop_is_stopped_even_with_the_abort_after_cleanup() -> None:
    assert ends(fed("llamacpp", t.llamacpp_healthy(), t.real("llamacpp-ctrl-c-stop.log"))) == ("stopped", 0)


def test_a_server_killed_without_a_word_is_stopped() -> None:
    assert ends(fed("sglang", t.real("sglang-eagle3-launch.log"))) == ("stopped", 0)


def test_vllm_bad_request_traceback_while_serving_is_no_fatal_event() -> None:
    interpreter = fed("vllm", t.vllm_healthy(), t.real("vllm-0.15-bad-request.log"))
    snap = interpreter.snapshot()
    assert snap.phase == "serving" and snap.events["fatal"] == 0
    assert ends(interpreter) == ("stopped", 0)


def test_a_traceback_before_serving_is_still_fatal() -> None:
    interpreter = fed("vllm", t.vllm_healthy()[:2000], t.real("vllm-0.15-bad-request.log"))
    assert interpreter.snapshot().events["fatal"] == 1


def test_sglang_request_error_and_llamacpp_send_error_are_not_fatal() -> None:
    sglang = fed("sglang", t.real("sglang-eagle3-launch.log"),
                 '[2025-06-11 06:19:30] INFO:     172.20.0.1:40106 - "POST /v1/chat/completions HTTP/1.1" 500 '
                 "Internal Server Error\n[2025-06-11 06:19:30] ERROR:    Exception in ASGI application\n"
                 "Traceback (most recent call last):\n")  # sgl-project/sglang issue #7083
    assert sglang.snapshot().events["fatal"] == 0
    llamacpp = fed("llamacpp", t.llamacpp_healthy(), t.real("llamacpp-request-error.log"))
    assert llamacpp.snapshot().events["fatal"] == 0 and llamacpp.snapshot().phase == "serving"


def test_a_ggml_abort_of_fatal_error_while_serving_fails() -> None:
    """`GGML_ABORT("fatal error")`, as ggml's `ggml_abort` prints it (ik_llama.cpp issue #530, while serving);
    the counter-test: a compiler's `fatal error:` after a line and a column is no abort."""
    abort = "/home/mukul/dev-ai/ik_llama.cpp/ggml/src/iqk/iqk_mul_mat.cpp:700: Fatal error\n"
    interpreter = fed("llamacpp", t.llamacpp_healthy(), abort)
    assert interpreter.snapshot().events["fatal"] == 1 and interpreter.snapshot().phase == "failed"
    compiler = "tools/server/server.cpp:12:10: fatal error: llama.h: No such file or directory\n"
    interpreter = fed("llamacpp", t.llamacpp_healthy(), compiler)
    assert interpreter.snapshot().events["fatal"] == 0 and interpreter.snapshot().phase == "serving"


def test_an_older_llamacpps_cuda_init_at_model_load_is_the_same_launch() -> None:
    """b3802 prints `build:` first and `ggml_cuda_init` at model load (ggml-org/llama.cpp issue #9587): one launch.
    The counter-tests: a newer build prints `ggml_cuda_init` first, so its next one is a restart, whether a build
    line follows it or, at today's default verbosity, none."""
    cuda = "ggml_cuda_init: found 1 CUDA devices:\n"
    older = fed("llamacpp", "build: 3802 (a5b57b08) with cc (Ubuntu 13.2.0-23ubuntu4) 13.2.0 for x86_64-linux-gnu\n",
                "llama_model_loader: loaded meta data with 47 key-value pairs and 508 tensors\n", cuda,
                "llm_load_tensors: ggml ctx size =    0.23 MiB\n")
    assert older.snapshot().events["server_restart"] == 0 and older.snapshot().phase == "loading_weights"
    newer = fed("llamacpp", cuda, "build_info: b8680-15f786e65\n", t.llamacpp_healthy(), cuda,
                "build_info: b8680-15f786e65\n")
    assert newer.snapshot().events["server_restart"] == 1 and newer.snapshot().phase == "launching"
    bare = fed("llamacpp", cuda, "srv  llama_server: model loaded\n", "srv  llama_server: listening on http://x\n",
               cuda)
    assert bare.snapshot().events["server_restart"] == 1 and bare.snapshot().phase == "launching"


def test_tgi_method_error_while_serving_is_not_fatal() -> None:
    line = "2024-06-03T07:10:01.000001Z ERROR text_generation_launcher: Method Prefill encountered an error.\n"
    assert fed("tgi", t.tgi_healthy(), line).snapshot().events["fatal"] == 0


def test_sglang_eagle3_launch_is_one_launch_with_both_shard_bars() -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"))
    snap = interpreter.snapshot()
    assert snap.phase == "serving" and snap.events["server_restart"] == 0 and snap.launches == 1
    assert (snap.shards_loaded, snap.shards_expected) == (5, 5)  # the target's 4 and the draft's 1
    assert phase_steps("sglang", t.real("sglang-eagle3-launch.log")) == [
        "stopped", "launching", "loading_weights", "allocating_memory", "capturing_graphs",
        "loading_weights", "allocating_memory", "capturing_graphs",  # the draft model and its graphs
        "warming_up", "serving"]


def test_sglang_dflash_launch_is_one_launch() -> None:
    interpreter = fed("sglang", t.real("sglang-dflash-launch.log"))
    snap = interpreter.snapshot()
    assert snap.phase == "serving" and snap.events["server_restart"] == 0 and snap.launches == 1
    assert (snap.shards_loaded, snap.shards_expected) == (6, 6)


def test_mtp_draft_rereads_the_targets_shards_and_both_count() -> None:
    snap = fed("sglang", t.real("sglang-mtp-draft.log")).snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == (4, 4)  # the target's bar is before this excerpt
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log").split("[2025-09-04 13:07:35]")[0],
                      t.real("sglang-mtp-draft.log"))
    assert (interpreter.snapshot().shards_loaded, interpreter.snapshot().shards_expected) == (8, 8)


def test_vllm_drafter_bar_adds_to_the_target() -> None:
    interpreter = fed("vllm", t.vllm_healthy().split("(Worker_TP0 pid=525800) INFO 11-20 09:01:21")[0],
                      t.real("vllm-0.19-eagle3-drafter.log"))
    snap = interpreter.snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == (31, 31) and snap.events["server_restart"] == 0


def test_a_wrappers_banner_before_the_engines_own_is_one_launch() -> None:
    interpreter = fed("llamacpp", "build: 4785 (aa6192d3) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n",
                      t.llamacpp_healthy())
    assert interpreter.snapshot().launches == 1 and interpreter.snapshot().events["server_restart"] == 0


def test_a_banner_read_after_the_probe_made_it_serving_is_the_same_launch() -> None:
    """Discovery finds the process, its probe answers, and only then is its log read from the banner on."""
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.process_started(time.time() - 5)
    interpreter.probe_succeeded(time.time() + 1)
    fed("sglang", t.real("sglang-eagle3-launch.log"), interpreter=interpreter)
    assert interpreter.snapshot().launches == 1 and interpreter.snapshot().events["server_restart"] == 0


def test_a_new_banner_after_progress_is_a_restart() -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"), t.real("sglang-eagle3-launch.log"))
    assert interpreter.snapshot().launches == 2 and interpreter.snapshot().events["server_restart"] == 1


def test_sglang_multi_thread_shard_bar_counts() -> None:
    interpreter = fed("sglang", t.real("sglang-multithread-shards.log").split("\n")[0] + "\n")
    snap = interpreter.snapshot()
    assert snap.phase == "loading_weights" and (snap.shards_loaded, snap.shards_expected) == (2, 2)
    bar = t.real("sglang-multithread-shards.log").splitlines()[-1] + "\n"
    assert (fed("sglang", bar).snapshot().shards_expected) == 141


@pytest.mark.parametrize("log", ["vllm-0.11-compile-profile-run.log", "vllm-0.22-mtp-compile-profile-run.log"])
def test_vllm_profile_run_is_allocating_memory_until_graph_capture(log: str) -> None:
    assert phase_steps("vllm", t.real(log)) == ["allocating_memory", "capturing_graphs", "warming_up"]
    text = t.real(log)
    before_capture = text[: text.index("Capturing CUDA graphs")]
    assert fed("vllm", before_capture).snapshot().phase == "allocating_memory"


def test_an_sglang_worker_node_is_ready_at_its_dummy_health_server_without_a_shard_bar() -> None:
    """The real node-1 log: every local rank loads and captures, no shard bar (global rank 0 only), then the dummy
    health server; once node 0 went away its schedulers fail and it exits."""
    interpreter = _phase_of("sglang", t.real("sglang-worker-node.log"), worker=True)
    snap = interpreter.snapshot()
    assert (snap.phase, snap.shards_loaded, snap.shards_expected) == ("serving", None, None)
    assert interpreter.snapshot().timeline == ("launching", "loading_weights", "allocating_memory",
                                                "capturing_graphs", "serving")
    interpreter.feed(t.real("sglang-worker-node-head-lost.log").encode())
    assert interpreter.snapshot().phase == "failed"
    assert interpreter.snapshot().events["fatal"] >= 1


def test_a_vllm_headless_node_is_ready_at_its_own_load_line_and_a_head_is_not() -> None:
    log = t.vllm_headless_dp(1, "10.99.48.128")
    assert _phase_of("vllm", log, worker=True).snapshot().phase == "serving"
    head = _phase_of("vllm", log, worker=False)  # the same lines on a single node are not its ready
    assert head.snapshot().phase == "warming_up"
    assert _phase_of("vllm", t.vllm_healthy(tp=2), worker=True).snapshot().phase == "serving"
    assert _phase_of("vllm", t.vllm_healthy(tp=2)[:t.vllm_healthy(tp=2).index("Model loading took")],
                     worker=False).snapshot().phase == "allocating_memory"


def test_sglang_eagle3_healthy_startup() -> None:
    assert phases("sglang", t.sglang_healthy()) == [
        "launching", "loading_weights", "allocating_memory", "capturing_graphs",
        "loading_weights", "allocating_memory", "capturing_graphs",  # the EAGLE3 draft model and its graphs
        "warming_up", "serving",
    ]


def test_sglang_stall_after_last_shard() -> None:
    interpreter = run("sglang", t.sglang_until_shards(tp=8, shards=64))
    snap = interpreter.snapshot()
    phase, loaded, total, events = snap.phase, snap.shards_loaded, snap.shards_expected, snap.events
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
    snap = interpreter.snapshot()
    phase, events = snap.phase, snap.events
    assert phase == "failed"
    assert events["fatal"] == 3  # scheduler exception, capture failure, the launcher's sigquit notice
    assert events["oom"] == 1
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "failed"


def test_sglang_nccl_watchdog_timeout() -> None:
    interpreter = run("sglang", t.sglang_nccl_timeout())
    snap = interpreter.snapshot()
    phase, events = snap.phase, snap.events
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
    snap = interpreter.snapshot()
    phase, loaded, events = snap.phase, snap.shards_loaded, snap.events
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
    snap = interpreter.snapshot()
    phase, events = snap.phase, snap.events
    assert phase == "failed" and events["fatal"] == 2 and events["oom"] == 1


def test_tgi_startup_and_shard_crash() -> None:
    assert phases("tgi", t.tgi_healthy()) == ["launching", "loading_weights", "warming_up", "capturing_graphs",
                                              "warming_up", "serving"]
    interpreter = run("tgi", t.tgi_shard_crash())
    # The shard's traceback is judged by how it ends: it has not ended yet; it has once the launcher exits.
    assert interpreter.snapshot().phase == "failed" and interpreter.snapshot().events["fatal"] == 1
    interpreter.process_gone()
    assert interpreter.snapshot().phase == "failed" and interpreter.snapshot().events["fatal"] == 2


def test_llamacpp_startup_and_load_error() -> None:
    assert phases("llamacpp", t.llamacpp_healthy()) == ["launching", "loading_weights", "allocating_memory",
                                                        "warming_up", "serving"]
    assert run("llamacpp", t.llamacpp_load_error()).snapshot().phase == "failed"


def test_ollama_serves_through_its_model_loads_and_a_failed_load_is_one_fatal_event() -> None:
    """Ollama's phase is its API's but for a model's load, `loading_weights` from its start line to its ready line
    (its runner's own llama.cpp lines, in the same log, move nothing), and a load that times out is a fatal event of
    that model's runner: the server serves again, and exits stopped, not failed."""
    ollama = fed("ollama", t.ollama_serving())
    assert ollama.snapshot().phase == "serving"
    for _ in range(3):
        assert phases("ollama", t.ollama_load(port="40123") + t.llamacpp_healthy() + t.ollama_loaded(),
                      interpreter=ollama) == ["loading_weights", "serving"]
    snap = ollama.snapshot()
    assert (snap.phase, snap.timeline[:4], snap.launches) == ("serving", ("launching", "serving", "loading_weights",
                                                                           "serving"), 1)
    assert not any(snap.events.values())
    fed("ollama", t.ollama_load(port="40124"), t.ollama_load_timeout(), interpreter=ollama)
    assert (ollama.snapshot().phase, ollama.snapshot().events["fatal"]) == ("serving", 1)
    assert ends(ollama) == ("stopped", 1)


def test_an_ollama_load_that_stalls_stays_loading_whatever_its_liveness_probe_says() -> None:
    """`/` answers 200 whatever the runners do: a probe does not end a load (it does make a launching Ollama whose
    listen line is not read yet serving). A client that gives up mid-load ends the load with no failure."""
    now = [100.0]
    ollama = LogInterpreter(ENGINES["ollama"], wall=lambda: now[0])
    ollama.process_started(99.0)
    now[0] += 1
    ollama.probe_succeeded(at=now[0])
    assert ollama.snapshot().phase == "serving"
    ollama.feed(t.ollama_serving().encode())
    now[0] += 1
    ollama.feed(t.ollama_load().encode())
    for _ in range(3):
        now[0] += 10
        ollama.probe_succeeded(at=now[0])
    assert (ollama.snapshot().phase, ollama.snapshot().since) == ("loading_weights", 102.0)
    cancelled = ('time=2026-11-20T09:15:02.605Z level=INFO source=sched.go:641 msg="Load failed" model=/m '
                 'error="timed out waiting for llama-server to start: context canceled"\n')
    ollama.feed(cancelled.encode())
    assert ollama.snapshot().phase == "serving" and not any(ollama.snapshot().events.values())


def test_ollamas_gpu_discovery_runner_is_no_model_load() -> None:
    """Before 2026-05-29 Ollama starts a runner without a model at every start to discover its GPUs, logged as a
    model's runner is (`tests/fixtures/logs/ollama-0.18.0-metal-gpu-discovery-runner-idle.log`): it loads nothing
    and prints no ready line, so an idle server read as a load that never ends. The counter-test: a runner given a
    model is its load."""
    discovery = ('time=2026-03-23T11:57:09.152+08:00 level=INFO source=server.go:430 msg="starting runner" '
                 'cmd="/Applications/Ollama.app/Contents/Resources/ollama runner --ollama-engine --port 49156"\n')
    ollama = fed("ollama", t.ollama_serving(), discovery)
    assert ollama.snapshot().phase == "serving"
    load = ('time=2026-02-25T18:14:34.258+08:00 level=INFO source=server.go:431 msg="starting runner" '
            'cmd="/opt/homebrew/Cellar/ollama/0.17.0/bin/ollama runner --model /Users/my/.ollama/models/blobs/'
            'sha256-816441b33390807d429fbdb1de7e33bb4d569ac68e2203bdbca5d8d79b5c7266 --port 54686"\n')
    assert fed("ollama", load, interpreter=ollama).snapshot().phase == "loading_weights"


def test_ollamas_2024_load_line_is_a_load_too() -> None:
    """From 2024 to 2025-05 Ollama logged a model's load as `starting llama server` (a space), its runner
    `ollama_llama_server`: a load that stalled there stayed `serving`."""
    load = ('time=2024-07-05T02:37:04.476Z level=INFO source=server.go:368 msg="starting llama server" '
            'cmd="/tmp/ollama3197932021/runners/cpu/ollama_llama_server --model /root/.ollama/models/blobs/'
            'sha256-6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa --ctx-size 2048 --port 40213"\n')
    ollama = fed("ollama", t.ollama_serving(), load)
    assert ollama.snapshot().phase == "loading_weights"
    ready = 'time=2024-07-05T02:37:06.983Z level=INFO source=server.go:609 msg="llama runner started in 2.51 seconds"\n'
    assert fed("ollama", ready, interpreter=ollama).snapshot().phase == "serving"
    assert ENGINES["ollama"].role_title.search("/tmp/ollama3197932021/runners/cpu/ollama_llama_server --model x")


def test_an_ollama_gone_without_a_word_stopped_and_one_whose_go_runtime_died_failed() -> None:
    """`ollama serve` logs nothing as it stops (SIGTERM closes its HTTP server and ends its runners): gone without a
    failure in its log, it stopped on request (no InferenceServerDown), with or without a load that failed (its
    runner's). The counter-tests: Go's runtime, an unrecovered panic or a fatal error, then gone, is a failure; a
    handler's panic that gin recovered (`recovery.go`: `[Recovery] <time> panic recovered:`) is not its death."""
    stopped = fed("ollama", t.ollama_serving(), t.ollama_load(), t.ollama_loaded(), t.ollama_load_timeout())
    assert ends(stopped) == ("stopped", 1) and stopped.snapshot().stop_requested
    recovered = ("[Recovery] 2026/11/20 - 09:14:02 panic recovered:\nruntime error: index out of range [3] with "
                 "length 3\n/usr/local/go/src/runtime/panic.go:115 (0x4452c4)\n")
    assert ends(fed("ollama", t.ollama_serving(), recovered)) == ("stopped", 0)
    for death in (t.ollama_panic(), "fatal error: concurrent map writes\n\ngoroutine 77 [running]:\n"):
        died = fed("ollama", t.ollama_serving(), death)
        assert died.snapshot().phase == "serving"
        assert ends(died) == ("failed", 1) and not died.snapshot().stop_requested


def test_ollama_polled_pages_are_heartbeats_and_a_generation_is_progress() -> None:
    now = [100.0]
    ollama = LogInterpreter(ENGINES["ollama"], wall=lambda: now[0])
    ollama.feed(t.ollama_serving().encode())
    for path, method in (("/", "GET"), ("/", "HEAD"), ("/api/version", "GET"), ("/api/ps", "GET")):
        now[0] += 15
        ollama.feed(f'[GIN] 2026/11/20 - 09:14:17 | 200 |  41.2µs |  127.0.0.1 | {method:<7} "{path}"\n'.encode())
    assert ollama.snapshot().progress == 100.0
    ollama.feed(t.ollama_loaded().encode())
    assert ollama.snapshot().progress == now[0] == 160.0


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
    # What answers once the process is gone is another's (a Service's other replica, a probe in flight): still stopped
    interpreter.probe_succeeded(at=190.0)
    assert interpreter.snapshot().phase == "stopped"
    interpreter.process_started(create_time=170.0)
    assert interpreter.snapshot().phase == "launching" and interpreter.snapshot().events["server_restart"] == 1
    interpreter.probe_succeeded(at=195.0)
    assert interpreter.snapshot().phase == "serving"


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
