"""llama.cpp's own llama-server (build b11434, from the pinned PyPI sdist: scripts/build-llama-server) under the real
exporter with no server configured, as a new user runs them: found by discovery, its log followed through its
stdout, its requests counted from its `/metrics`, its stops, failures and hangs read right (issue 27)."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from pathlib import Path

import psutil
import pytest

from support.configs import FAST_REMEMBERING
from support.harness import Exporter, Scrape, diagnose, poll, require
from support.llamacpp import LlamaServer, freeze_thread

CONFIG = FAST_REMEMBERING + "engine_metrics: {interval: 0.3s, timeout: 1s}\n"


def phase(scrape: Scrape, server: str) -> str | None:
    return next((s.labels["phase"] for s in scrape.samples("stallwatch_startup_phase")
                 if s.labels.get("server") == server and s.value == 1), None)


def test_a_healthy_start_reads_serving_from_its_log_and_its_requests_are_counted(exporter, llama,
                                                                                 tmp_path: Path) -> None:
    """Today's format (no `build:` line, `srv  llama_server: model loaded`, `listening on`, each line after its uptime
    and level letter) reads `serving` from the log alone; three completions of 8 tokens are 24 tokens on its page."""
    e = exporter(config=CONFIG)
    server = llama()
    server.wait_healthy()
    scrape = e.wait_for(lambda s: phase(s, server.name) == "serving" and s, timeout=20, what="serving from the log")
    assert scrape.value("stallwatch_log_events_total", server=server.name, event="fatal") == 0
    for _ in range(3):
        assert server.complete(tokens=8)["tokens_predicted"] == 8
    e.wait_for(lambda s: s.value("stallwatch_engine_generated_tokens_total", server=server.name, source="metrics")
               == 24 and s.value("stallwatch_engine_loop_up", server=server.name) == 1
               and s.value("stallwatch_probe_success", server=server.name) == 1, what="24 tokens, the probe passing")
    out = diagnose(tmp_path, server.name, config=None)
    assert out.returncode == 0 and "VERDICT: HEALTHY" in out.stdout and "serving" in out.stdout, out.stdout


def test_a_clean_stop_then_a_restart_in_the_same_log(exporter, llama) -> None:
    """Ctrl-C: `cleaning up before exit...`, exit 0: stopped, asked to stop, no fatal. The same command again,
    appended to the same file: a new launch (`llama_server: initializing ...`), counted as a restart, serving."""
    e = exporter(config=CONFIG)
    first = llama()
    first.wait_healthy()
    e.wait_for(lambda s: phase(s, first.name) == "serving"
               and s.log("stallwatch_log_up", server=first.name, path=str(first.log)) == 1, timeout=20,
               what="serving, its log followed")
    first.signal(signal.SIGINT)
    assert first.wait() == 0
    # The process's end and its last lines may be read in either order.
    scrape = e.wait_for(lambda s: phase(s, first.name) == "stopped"
                        and s.value("stallwatch_server_stop_requested", server=first.name) == 1 and s,
                        what="stopped on request")
    assert scrape.value("stallwatch_log_events_total", server=first.name, event="fatal") == 0
    again = llama(port=first.port)
    again.wait_healthy()
    scrape = e.wait_for(lambda s: phase(s, first.name) == "serving" and s.value(
        "stallwatch_log_events_total", server=first.name, event="server_restart") == 1 and s, timeout=20,
        what="the restart read as a new launch, serving")
    assert scrape.value("stallwatch_server_stop_requested", server=first.name) == 0


def test_a_kill_is_not_a_stop(exporter, llama, tmp_path: Path) -> None:
    """SIGKILL leaves no stop line: the server is down without having been asked to stop (InferenceServerDown
    pages it), and `diagnose NAME`, its process gone, still reports it: down, last serving."""
    e = exporter(config=CONFIG)
    server = llama()
    server.wait_healthy()
    e.wait_for(lambda s: phase(s, server.name) == "serving", timeout=20, what="serving")
    server.signal(signal.SIGKILL)
    server.wait()
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=server.name) == 0 and s, what="down")
    assert scrape.value("stallwatch_server_stop_requested", server=server.name) == 0
    out = diagnose(tmp_path, server.name, f"--web.listen-address=127.0.0.1:{e.port}", config=None)
    verdict = next((line for line in out.stdout.splitlines() if line.startswith("VERDICT:")), out.stdout)
    assert out.returncode == 1 and verdict.startswith("VERDICT: DOWN") and "last in serving" in verdict, out.stdout


def test_a_model_that_fails_to_load_is_failed(exporter, llama, tmp_path: Path) -> None:
    """`invalid magic characters`, `error loading model`, the cleanup line of every exit, then `exiting due to model
    loading error`, exit 1 within milliseconds (before any discovery pass: the server is configured, with its log):
    failed with fatal lines, not stopped."""
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"")
    e = exporter(config=CONFIG + f"servers:\n  - {{name: tiny, engine: llamacpp, logs: ['{log}']}}\n")
    # Followed before the server writes: what it writes then is news (lines already there would be old news).
    e.wait_for(lambda s: s.log("stallwatch_log_up", server="tiny", path=str(log)) == 1, what="the log followed")
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"not a gguf file\n" * 8)
    server = llama(model=bad, log=log)
    assert server.wait() == 1
    scrape = e.wait_for(lambda s: phase(s, "tiny") == "failed" and s, timeout=20, what="failed")
    assert (scrape.value("stallwatch_log_events_total", server="tiny", event="fatal") or 0) >= 1
    assert "exiting due to model loading error" in server.log.read_text()


def test_a_sigstopped_server_is_diagnosed_stalled(exporter, llama, tmp_path: Path) -> None:
    """SIGSTOP: state T, every probe times out, the phase stays serving. `diagnose` names it stalled from the
    evidence it prints (the process state, the probe's timeout), not starting."""
    e = exporter(config=CONFIG)
    server = llama()
    server.wait_healthy()
    e.wait_for(lambda s: phase(s, server.name) == "serving", timeout=20, what="serving")
    server.signal(signal.SIGSTOP)
    try:
        scrape = e.wait_for(lambda s: s.value("stallwatch_probe_success", server=server.name) == 0 and s,
                            what="the probe failing")
        assert phase(scrape, server.name) == "serving"
        result = diagnose(tmp_path, server.name, config=None)
        assert "STALLED" in result.stdout and "state T" in result.stdout, result.stdout + result.stderr
    finally:
        server.signal(signal.SIGCONT)


def test_a_frozen_main_loop_is_told_from_an_idle_one(exporter, llama) -> None:
    """The main thread stopped (ptrace, one thread), the HTTP threads alive: /health 200, /metrics and a completion
    hang. The loop reads down (`engine_loop_up 0`) while the probe passes, and the `cancel task` lines each timed-out
    fetch leaves are heartbeats: the log's last progress does not move. Released, the loop answers again."""
    e = exporter(config=CONFIG)
    server = llama()
    server.wait_healthy()
    scrape = e.wait_for(lambda s: s.value("stallwatch_engine_loop_up", server=server.name) == 1 and s, timeout=20,
                        what="the loop answering")
    tracer = freeze_thread(server.proc.pid)
    try:
        waiting = threading.Thread(target=_completion_that_waits, args=(server,), daemon=True)
        waiting.start()
        scrape = e.wait_for(lambda s: s.value("stallwatch_engine_loop_up", server=server.name) == 0 and s,
                            what="the loop read down")
        progress = scrape.value("stallwatch_log_last_progress_timestamp_seconds", server=server.name)
        poll(lambda: server.log.read_text().count("stop: cancel task") >= 3, timeout=20,
             what="three timed-out fetches logged")
        scrape = e.wait_for(lambda s: (s.value("stallwatch_log_lines_total", server=server.name) or 0) > 0 and s,
                            what="the cancel lines read")
        assert server.healthy()
        assert scrape.value("stallwatch_probe_success", server=server.name) == 1
        assert phase(scrape, server.name) == "serving"
        assert scrape.value("stallwatch_log_last_progress_timestamp_seconds", server=server.name) == progress
    finally:
        tracer.kill()
        tracer.wait()
    e.wait_for(lambda s: s.value("stallwatch_engine_loop_up", server=server.name) == 1, what="the loop answering again")


def _completion_that_waits(server: LlamaServer) -> None:
    with contextlib.suppress(OSError):  # the server was stopped with the request open
        server.complete(timeout=60)


@pytest.mark.parametrize("tool", ["gdb", "strace"])
def test_a_debugger_or_tracer_running_the_server_is_not_discovered(exporter, llama, tool: str) -> None:
    """`gdb -batch -ex run --args llama-server ...` and `strace -f -o /dev/null llama-server ...`: the tool is not
    the server (it was discovered as one, on the server's port, and InferenceServerDown fired when it exited); the
    server it runs is, once."""
    require(tool)
    prefix = {"gdb": ["gdb", "-q", "-batch", "-ex", "run", "--args"], "strace": ["strace", "-f", "-o", "/dev/null"]}
    e: Exporter = exporter(config=CONFIG)
    server = llama(prefix=prefix[tool])
    server.wait_healthy()
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=server.name) == 1 and s, timeout=30,
                        what="the server under the tool")
    assert scrape.value("stallwatch_server_up", server=server.name) == 1
    # Only what runs under the tool counts: another test's llama-server on this machine is no business of this one.
    tree = {server.proc.pid, *(p.pid for p in psutil.Process(server.proc.pid).children(recursive=True))}
    discovered = [line for line in e.log.read_text().splitlines() if "discovered llamacpp server" in line
                  and int(re.search(r"\(pid (\d+),", line).group(1)) in tree]  # type: ignore[union-attr]
    assert len(discovered) == 1 and f"(pid {server.proc.pid}," not in discovered[0], discovered
    assert f"discovered llamacpp server {server.name} " in discovered[0], discovered
