"""Phases through the exporter's scrape: log age, stalls, crashes, stops, probes and a restarted exporter."""

from __future__ import annotations

import time
from pathlib import Path

from support import transcripts as t
from support.harness import Scrape, gpus


def _phase(scrape: Scrape, server: str) -> str | None:
    return next((ls["phase"] for ls in scrape.labelsets("stallwatch_startup_phase")
                 if ls["server"] == server and scrape.value("stallwatch_startup_phase", **ls) == 1), None)


CONFIG = ("discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
          "defaults:\n  probe: {timeout: 1s, interval: 1s}\n")


def phase_of(s: Scrape, server: str) -> str | None:
    on = [ls["phase"] for ls in s.labelsets("stallwatch_startup_phase")
          if ls["server"] == server and s.value("stallwatch_startup_phase", server=server, phase=ls["phase"]) == 1]
    return on[0] if len(on) == 1 else None


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
    # Stopped on request: the process gone, and (read a moment before or after that) its stop lines.
    scrape = e.wait_for(lambda s: all(_phase(s, sim.name) == "stopped"
                                      and s.value("stallwatch_server_stop_requested", server=sim.name) == 1
                                      for sim in (sglang, vllm))
                        and _phase(s, crashed.name) == "failed"
                        and s.value("stallwatch_log_events_total", server=crashed.name, event="fatal") == 3 and s,
                        what="stopped, stopped, and failed with its three fatal lines read")
    for sim in (sglang, vllm):
        assert scrape.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 0, sim.name
        assert scrape.value("stallwatch_server_up", server=sim.name) == 0
        # Discovered, and stopped on request: what InferenceServerDown needs to tell a stop from an outage.
        assert scrape.value("stallwatch_server_configured", server=sim.name) == 0
    assert scrape.value("stallwatch_server_stop_requested", server=crashed.name) == 0
    assert scrape.value("stallwatch_log_last_event_timestamp_seconds", server=crashed.name, event="fatal") > 0
    # One launch, though its probe may answer before its log is read (and the banner replayed).
    assert scrape.value("stallwatch_log_events_total", server=sglang.name, event="server_restart") == 0


def test_growing_log_age_drops_within_a_second(exporter, tmp_path: Path) -> None:
    log = tmp_path / "grow.log"
    log.write_bytes(b"")
    e = exporter(config=f"servers:\n  - name: grow\n    engine: sglang\n    match: {{cmdline: no-such-xyz}}\n"
                        f"    logs: ['{log}']\n    probes: []\n")
    e.wait_for(lambda s: s.log("stallwatch_log_up", server="grow", path=str(log)) == 1)
    time.sleep(1.5)  # let the age grow past a second first
    with open(log, "ab") as f:
        f.write(b"[2026-11-20 09:14:02] server_args=ServerArgs(model_path='m')\n")
    e.wait_for(lambda s: s.log("stallwatch_log_last_line_age_seconds", server="grow", path=str(log)) < 1,
               what="last_line_age < 1 s")
    scrape = e.scrape()
    assert scrape.log("stallwatch_log_lines_total", server="grow", path=str(log)) == 1
    assert phase_of(scrape, "grow") == "launching"


def test_seed_stall_after_64_of_64_shards(exporter, engine) -> None:
    sim = engine("sglang", t.sglang_until_shards(tp=8, shards=64), final="stall", tp=8)
    e = exporter(nvml={"gpus": gpus(8)})
    scrape = e.wait_for(lambda s: s.value("stallwatch_weight_shards_loaded", server=sim.name) == 64 and s,
                        what="shard progress")
    assert phase_of(scrape, sim.name) == "loading_weights"
    assert scrape.value("stallwatch_weight_shards_expected", server=sim.name) == 64
    assert scrape.log("stallwatch_log_up", server=sim.name, path=str(sim.log)) == 1
    assert scrape.log("stallwatch_log_size_bytes", server=sim.name, path=str(sim.log)) == sim.log.stat().st_size
    assert all(scrape.value("stallwatch_log_events_total", server=sim.name, event=ev) == 0
               for ev in ("fatal", "nccl_timeout", "oom", "stall_warning", "server_restart"))
    first = scrape.log("stallwatch_log_last_line_age_seconds", server=sim.name, path=str(sim.log))
    e.wait_for(lambda s: s.log("stallwatch_log_last_line_age_seconds", server=sim.name, path=str(sim.log))
               >= first + 1, what="the log age to grow")


def test_serving_then_process_gone_is_stopped(exporter, engine) -> None:
    sim = engine("sglang", t.sglang_healthy(tp=2), final="serve", tp=2)
    e = exporter()
    e.wait_for(lambda s: phase_of(s, sim.name) == "serving", what="serving")
    sim.stop()
    e.wait_for(lambda s: phase_of(s, sim.name) == "stopped", what="stopped")


def test_crash_during_graph_capture_is_failed(exporter, engine) -> None:
    e = exporter()  # first: the server launches while watched, so its events are new
    sim = engine("sglang", t.sglang_graph_crash(tp=2), final="stall", tp=2)
    scrape = e.wait_for(lambda s: phase_of(s, sim.name) == "failed" and s, timeout=25, what="failed")
    assert scrape.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 3
    assert scrape.value("stallwatch_log_events_total", server=sim.name, event="oom") == 1


def test_probe_success_means_serving_without_a_readable_log(exporter, engine, tmp_path: Path) -> None:
    sim = engine("vllm", t.vllm_healthy()[:500], final="serve", tp=1)
    e = exporter(config=f"servers:\n  - name: blind\n    engine: vllm\n"
                        f"    match: {{cmdline: 'api_server.*{sim.port}'}}\n"
                        f"    logs: ['{tmp_path}/missing.log']\n"
                        f"    probes: [{{url: 'http://127.0.0.1:{sim.port}/health', interval: 1s}}]\n")
    # The first probe can answer before the log follower's first pass: wait for both.
    scrape = e.wait_for(lambda s: phase_of(s, "blind") == "serving" and s.value("stallwatch_log_up", server="blind")
                        is not None and s, what="serving from the probe")
    assert scrape.log("stallwatch_log_up", server="blind", path=f"{tmp_path}/missing.log") == 0


def test_exporter_restart_recovers_phase_from_existing_log(exporter, engine) -> None:
    sim = engine("sglang", t.sglang_healthy(tp=2) + "".join(t.sglang_decode(50)), final="stall", tp=2)
    first = exporter()
    first.wait_for(lambda s: phase_of(s, sim.name) == "serving")
    first.stop()
    second = exporter()
    scrape = second.wait_for(lambda s: phase_of(s, sim.name) == "serving" and s, what="recovered phase")
    assert scrape.value("stallwatch_weight_shards_loaded", server=sim.name) == 64
    assert scrape.value("stallwatch_log_events_total", server=sim.name, event="fatal") == 0
    assert scrape.log("stallwatch_log_read_bytes_total", server=sim.name, path=str(sim.log)) == 0
    age = scrape.log("stallwatch_log_last_line_age_seconds", server=sim.name, path=str(sim.log))
    assert age >= time.time() - sim.log.stat().st_mtime - 1


def test_servers_sharing_a_stdout_file_do_not_take_each_others_relaunches_and_fatal_lines(exporter, engine) -> None:
    """Audit 2026-12-02 #6: A crash-looping under a supervisor and B healthy, both `>> shared.log`; B counted A's
    relaunches and fatal lines (9 and 18). The file is said to be shared, and B counts none of A's lines. (B starts
    once A is watched: lines that a process not found yet wrote cannot be told from B's own.)"""
    e = exporter(config=CONFIG)
    looping = engine("sglang", t.sglang_graph_crash(tp=1), final="crash", tp=1, line_delay=0.1,
                     log_name="shared.log", supervise={"restart_sec": 0.5, "max_restarts": 3})
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=looping.name) == 1, timeout=30,
               what="the crash loop's first run watched")
    healthy = engine("sglang", t.sglang_healthy(tp=1), final="serve", tp=1, log_name="shared.log")
    looping.proc.wait(120)  # the supervisor's last run has ended
    banners = looping.log.read_text().count("server_args=ServerArgs(")
    assert banners >= 5, banners  # the loop's four, the healthy server's one

    def all_read(s: Scrape) -> Scrape | None:
        path = str(looping.log)
        read = (s.log("stallwatch_log_size_bytes", server=healthy.name, path=path) == looping.log.stat().st_size
                and s.log("stallwatch_log_backlog_bytes", server=healthy.name, path=path) == 0)
        return s if read and _phase(s, healthy.name) == "serving" else None

    scrape = e.wait_for(all_read, timeout=60, what="the shared file read to its end, the healthy server serving")
    for name in (healthy.name, looping.name):
        assert scrape.log("stallwatch_log_shared", server=name, path=str(looping.log)) == 1, name
    for event in ("server_restart", "fatal"):
        assert scrape.value("stallwatch_log_events_total", server=healthy.name, event=event) == 0, event
