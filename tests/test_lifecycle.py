"""A server's life read right, from published logs (tests/fixtures/logs, sources in SOURCES.md): a stop is not a
failure, one request's error is not the server's, a speculative draft model is not a restart, the shard bars of
every loader count, and the profile run is not graph capture."""

from __future__ import annotations

import time

import pytest

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from support import transcripts as t
from support.harness import Scrape


def fed(engine: str, *texts: str, interpreter: LogInterpreter | None = None) -> LogInterpreter:
    """The interpreter after `texts`, one line (or one tqdm update) at a time, as the follower hands them over."""
    interpreter = interpreter or LogInterpreter(ENGINES[engine])
    for text in texts:
        for line in text.encode().splitlines(keepends=True):
            for part in line.split(b"\r"):
                interpreter.feed(part if part.endswith(b"\n") else part + b"\n")
    return interpreter


def phases(engine: str, *texts: str) -> list[str]:
    interpreter = LogInterpreter(ENGINES[engine])
    seen: list[str] = []
    for text in texts:
        for line in text.splitlines(keepends=True):
            fed(engine, line, interpreter=interpreter)
            phase = interpreter.snapshot().phase
            if not seen or seen[-1] != phase:
                seen.append(phase)
    return seen


def ends(interpreter: LogInterpreter) -> tuple[str, int]:
    """The phase once the main process is gone, and the fatal events counted."""
    interpreter.process_gone()
    snap = interpreter.snapshot()
    return snap.phase, snap.events["fatal"]


# --- 1. a deliberate stop is not a failure; a crash still is -----------------------------------------------------

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


# --- 2. a request's error is not the server's failure ------------------------------------------------------------

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


def test_tgi_method_error_while_serving_is_not_fatal() -> None:
    line = "2024-06-03T07:10:01.000001Z ERROR text_generation_launcher: Method Prefill encountered an error.\n"
    assert fed("tgi", t.tgi_healthy(), line).snapshot().events["fatal"] == 0


# --- 3. a speculative draft model is not a restart ---------------------------------------------------------------

def test_sglang_eagle3_launch_is_one_launch_with_both_shard_bars() -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"))
    snap = interpreter.snapshot()
    assert snap.phase == "serving" and snap.events["server_restart"] == 0 and interpreter.launches == 1
    assert (snap.shards_loaded, snap.shards_expected) == (5, 5)  # the target's 4 and the draft's 1
    assert phases("sglang", t.real("sglang-eagle3-launch.log")) == [
        "stopped", "launching", "loading_weights", "allocating_memory", "capturing_graphs",
        "loading_weights", "allocating_memory", "capturing_graphs",  # the draft model and its graphs
        "warming_up", "serving"]


def test_sglang_dflash_launch_is_one_launch() -> None:
    interpreter = fed("sglang", t.real("sglang-dflash-launch.log"))
    snap = interpreter.snapshot()
    assert snap.phase == "serving" and snap.events["server_restart"] == 0 and interpreter.launches == 1
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
    assert interpreter.launches == 1 and interpreter.snapshot().events["server_restart"] == 0


def test_a_banner_read_after_the_probe_made_it_serving_is_the_same_launch() -> None:
    """Discovery finds the process, its probe answers, and only then is its log read from the banner on."""
    interpreter = LogInterpreter(ENGINES["sglang"])
    interpreter.process_started(time.time() - 5)
    interpreter.probe_succeeded(time.time() + 1)
    fed("sglang", t.real("sglang-eagle3-launch.log"), interpreter=interpreter)
    assert interpreter.launches == 1 and interpreter.snapshot().events["server_restart"] == 0


def test_a_new_banner_after_progress_is_a_restart() -> None:
    interpreter = fed("sglang", t.real("sglang-eagle3-launch.log"), t.real("sglang-eagle3-launch.log"))
    assert interpreter.launches == 2 and interpreter.snapshot().events["server_restart"] == 1


# --- 4. lines of real versions that were missed ------------------------------------------------------------------

def test_sglang_multi_thread_shard_bar_counts() -> None:
    interpreter = fed("sglang", t.real("sglang-multithread-shards.log").split("\n")[0] + "\n")
    snap = interpreter.snapshot()
    assert snap.phase == "loading_weights" and (snap.shards_loaded, snap.shards_expected) == (2, 2)
    bar = t.real("sglang-multithread-shards.log").splitlines()[-1] + "\n"
    assert (fed("sglang", bar).snapshot().shards_expected) == 141


@pytest.mark.parametrize("log", ["vllm-0.11-compile-profile-run.log", "vllm-0.22-mtp-compile-profile-run.log"])
def test_vllm_profile_run_is_allocating_memory_until_graph_capture(log: str) -> None:
    assert phases("vllm", t.real(log)) == ["allocating_memory", "capturing_graphs", "warming_up"]
    text = t.real(log)
    before_capture = text[: text.index("Capturing CUDA graphs")]
    assert fed("vllm", before_capture).snapshot().phase == "allocating_memory"


# --- through the exporter: a simulated engine stopped by SIGTERM, one that crashes ---------------------------------

def _phase(scrape: Scrape, server: str) -> str | None:
    return next((ls["phase"] for ls in scrape.labelsets("stallwatch_startup_phase")
                 if ls["server"] == server and scrape.value("stallwatch_startup_phase", **ls) == 1), None)


CONFIG = ("discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
          "defaults:\n  probe: {timeout: 1s, interval: 1s}\n")


def test_sigterm_stops_serving_engines_with_no_fatal_event_and_a_crash_still_fails(exporter, engine) -> None:
    e = exporter(config=CONFIG)
    sglang = engine("sglang", t.real("sglang-eagle3-launch.log"), final="serve", tp=1,
                    on_sigterm=t.real("sglang-sigterm-group-stop.log"))
    vllm = engine("vllm", t.vllm_healthy(tp=1) + t.real("vllm-0.15-bad-request.log"), final="serve", tp=1,
                  on_sigterm=t.real("vllm-0.15-sigterm-stop.log"))
    crashed = engine("sglang", t.real("sglang-eagle3-launch.log") + t.real("sglang-crash-while-serving.log"),
                     final="crash", tp=1, line_delay=0.05)  # lives a few seconds: discovery finds it
    e.wait_for(lambda s: all(_phase(s, sim.name) == "serving" for sim in (sglang, vllm)), what="both serving")
    assert e.scrape().value("stallwatch_log_events_total", server=vllm.name, event="fatal") == 0  # the 400s
    sglang.terminate()
    vllm.terminate()
    scrape = e.wait_for(lambda s: all(_phase(s, sim.name) == "stopped" for sim in (sglang, vllm))
                        and _phase(s, crashed.name) == "failed"
                        and s.value("stallwatch_log_events_total", server=crashed.name, event="fatal") == 3 and s,
                        what="stopped, stopped, and failed with its three fatal lines read")
    for sim in (sglang, vllm):
        assert scrape.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 0, sim.name
        assert scrape.value("stallwatch_server_up", server=sim.name) == 0
    assert scrape.value("stallwatch_log_last_event_timestamp_seconds", server=crashed.name, event="fatal") > 0
    # One launch, though its probe may answer before its log is read (and the banner replayed).
    assert scrape.value("stallwatch_log_events_total", server=sglang.name, event="server_restart") == 0
