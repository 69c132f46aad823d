"""`stallwatch diagnose` on simulated engines: each stall shape gets its verdict, in text and JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from stallwatch.report.model import SCHEMA as SCHEMA_PATH
from stallwatch.signals.nvml import NO_GPU, UNAVAILABLE, shows_nvidia_gpu
from support import transcripts
from support import transcripts as t
from support.harness import DIAGNOSE_STALE, Engine, Exporter, diagnose, gpus, poll

SCHEMA = json.loads(SCHEMA_PATH.read_text())


WAIT_FRAME = "wait_for_draft_hidden_states"  # where the simulated engine's processes sleep


def _held_by(sim: Engine, count: int = 8) -> dict:
    return {"gpus": [dict(g, processes=[{"pid": sim.proc.pid, "used": 76e9}]) for g in gpus(count)]}


def _json(out: subprocess.CompletedProcess[str]) -> dict:
    document = json.loads(out.stdout)
    jsonschema.validate(document, SCHEMA)
    assert len(document["servers"]) == 1
    return document["servers"][0]


def _logged(sim: Engine, text: str) -> Callable[[], bool]:
    return lambda: sim.log.exists() and text in sim.log.read_text()


CSI_OVERWRITE = "\x1b[2K\x1b[1AVERDICT: HEALTHY"  # erase the line above (the verdict) and forge it


OSC_CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4K\x07"  # writes the operator's clipboard in terminals that allow it


OSC_TITLE = "\x1b]0;OWNED\x07"


def test_stall_after_64_of_64(tmp_path: Path, engine) -> None:
    sim = engine("sglang", transcripts.sglang_until_shards(8, 64), final="stall")
    poll(_logged(sim, "64/64"), what="the last shard line")
    out = diagnose(tmp_path, sim.name, nvml=_held_by(sim))
    assert out.returncode == 1, out.stderr
    head = out.stdout.splitlines()[:6]
    assert head[0] == f"=== {sim.name} ==="
    assert head[1].startswith("VERDICT: STALLED: loaded but idle for ") and "in loading_weights" in head[1]
    assert "port never opened" in head[1] and f"waiting in `{WAIT_FRAME}`" in head[1]
    assert "engine sglang, model moonshotai/Kimi-K2-Instruct, TP 8, runtime host" in out.stdout
    assert "weight shards: 64/64" in out.stdout and "timeline: launching -> loading_weights" in out.stdout
    assert "server holds 76.0 GB" in out.stdout and "utilization 0%, busy 0% over the last 20 s" in out.stdout
    assert "CPU seconds over a 1 s window" in out.stdout and "scheduler_TP7" in out.stdout
    assert "[scheduler_TP0..7, detokenizer]" in out.stdout  # identical ranks printed once
    assert f"{WAIT_FRAME} (enginesim.py:" in out.stdout and "<-- WAIT" in out.stdout
    assert f"port {sim.port}: not listening" in out.stdout and "failed: refused" in out.stdout
    assert "Loading safetensors checkpoint shards: 100% Completed | 64/64" in out.stdout.splitlines()[-1]


def test_stall_json_validates_and_has_every_section(tmp_path: Path, engine) -> None:
    sim = engine("sglang", transcripts.sglang_until_shards(8, 64), final="stall")
    poll(_logged(sim, "64/64"), what="the last shard line")
    out = diagnose(tmp_path, sim.name, "--json", nvml=_held_by(sim))
    assert out.returncode == 1, out.stderr
    server = _json(out)
    assert server["verdict"]["status"] == "stalled"
    assert server["phase"]["phase"] == "loading_weights" and server["phase"]["shards_loaded"] == 64
    assert server["identity"]["pid"] == sim.proc.pid and server["identity"]["tensor_parallel"] == "8"
    assert [g["server_memory_bytes"] for g in server["gpu"]["gpus"]] == [76e9] * 8
    roles = {p["role"] for p in server["processes"]}
    assert {"main", "detokenizer", *(f"scheduler_TP{i}" for i in range(8))} <= roles
    stacks = {role: group for group in server["stacks"] for role in group["roles"]}
    for role in ("main", "scheduler_TP3", "detokenizer"):
        frames = stacks[role]["threads"][0]["frames"]
        assert frames[0]["function"] == WAIT_FRAME and frames[0]["wait"], frames
    assert server["port"]["listening"] is False and server["port"]["probes"][0]["reason"] == "refused"
    assert len(server["log"]["lines"]) <= 40 and server["log"]["lines"][-1].startswith("Loading safetensors")


def test_gpus_busy_over_recent_samples_are_not_idle(tmp_path: Path, engine) -> None:
    """Utilization now 0 but NVML's recent samples busy (a burst between two reads): no stall verdict."""
    sim = engine("sglang", transcripts.sglang_until_shards(8, 64), final="stall")
    poll(_logged(sim, "64/64"), what="the last shard line")
    held = _held_by(sim)
    for gpu in held["gpus"]:
        gpu["sample_util"] = 40
    out = diagnose(tmp_path, sim.name, "--json", nvml=held)
    server = _json(out)
    assert server["verdict"]["status"] == "starting", server["verdict"]
    gpu = server["gpu"]["gpus"][0]
    assert gpu["utilization"] == 0 and gpu["busy_ratio"] == pytest.approx(0.4) and gpu["busy_window_seconds"] > 10


def test_capture_spinning_in_a_collective_and_a_gpu_fault(tmp_path: Path, engine) -> None:
    """The GPUs at 100 % on 70 W of 700 W and the log silent in graph capture: busy-waiting in a collective, with
    the power shown per GPU. The same with the driver asking for a node reboot on one of them: the GPU's fault."""
    sim = engine("sglang", transcripts.sglang_until_capture(8), final="stall")
    poll(_logged(sim, "Capture target decode CUDA graph begin"), what="the capture's begin line")
    held = _held_by(sim)
    for gpu in held["gpus"]:
        gpu.update(util=100, power=70, power_limit=700)
    server = _json(diagnose(tmp_path, sim.name, "--json", nvml=held))
    assert server["verdict"]["status"] == "stalled", server["verdict"]
    assert "busy-waiting in a collective" in server["verdict"]["text"]
    assert "GPU 0 100% at 70 W of 700 W" in server["verdict"]["text"]
    gpu = server["gpu"]["gpus"][0]
    assert (gpu["power_watts"], gpu["power_limit_watts"], gpu["xids"]) == (70, 700, [])

    held["gpus"][3]["recovery_action"] = 2
    out = diagnose(tmp_path, sim.name, nvml=held)
    assert "VERDICT: FAILED: GPU 3 (GPU-" in out.stdout and "the driver asks for: node reboot" in out.stdout, out.stdout
    assert "70 W of 700 W, recovery action node reboot" in out.stdout


def test_diagnose_shows_the_kernel_logs_xids_and_nvmls_in_its_window(tmp_path: Path, engine) -> None:
    """`diagnose` reads the kernel log from its start and NVML's events in its window, as the exporter does (audit
    2026-12-02 #12: its runtime had neither, and a GPU that fell off the bus was "STARTING")."""
    sim = engine("sglang", transcripts.sglang_until_shards(1, 4), final="stall", tp=1)
    poll(_logged(sim, "4/4"), what="the last shard line")
    at = int((time.monotonic() - 120) * 1e6)  # /dev/kmsg's clock: microseconds since boot, 2 minutes ago
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(f"4,7,{at},-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
                     "GPU has fallen off the bus.\n".encode())
    held = _held_by(sim, 2)
    held["events"] = [{"id": 1, "gpu": 1, "type": "xid", "data": 109}]
    out = diagnose(tmp_path, sim.name, config=f"{DIAGNOSE_STALE}paths: {{kmsg: {kmsg}}}\n", nvml=held)
    assert out.returncode == 1, out.stdout + out.stderr
    verdict = out.stdout.splitlines()[1]
    assert verdict.startswith("VERDICT: FAILED: GPU 0 (GPU-") and "Xid 79 in the kernel log 2 min ago" in verdict
    assert "Xid 109 x1 " in out.stdout, out.stdout


def test_healthy_idle_server(tmp_path: Path, engine) -> None:
    sim = engine("sglang", transcripts.sglang_healthy(2), final="serve", tp=2)
    poll(_logged(sim, "The server is fired up"), what="the ready line")
    out = diagnose(tmp_path, sim.name, "--json", nvml=_held_by(sim, 2))
    assert out.returncode == 0, out.stdout + out.stderr
    server = _json(out)
    assert server["verdict"]["status"] == "healthy", server["verdict"]
    assert server["phase"]["phase"] == "serving" and server["port"]["listening"] is True
    assert server["port"]["probes"][0]["success"] is True and server["port"]["probes"][0]["status"] == 200


def test_crash_in_graph_capture(tmp_path: Path, engine) -> None:
    """A configured server whose process has died: the log tells that and why."""
    sim = engine("sglang", transcripts.sglang_graph_crash(8), final="crash")
    sim.proc.wait(30)
    config = (f"servers:\n  - name: kimi\n    engine: sglang\n    match: {{cmdline: 'no-such-process-d12'}}\n"
              f"    logs: [{sim.log}]\n")
    out = diagnose(tmp_path, "kimi", config=config)
    assert out.returncode == 1, out.stdout + out.stderr
    verdict = out.stdout.splitlines()[1]
    assert verdict.startswith("VERDICT: FAILED: failed") and "fatal" in verdict, verdict
    assert "Capture cuda graph failed: CUDA out of memory" in out.stdout
    # Absent NVML is reported, not fatal: as no GPU on a host that shows no NVIDIA device, else as unavailable.
    assert f"GPUs: {UNAVAILABLE if shows_nvidia_gpu('/', '/proc') else NO_GPU}" in out.stdout, out.stdout
    server = _json(diagnose(tmp_path, "kimi", "--json", config=config))
    assert server["phase"]["phase"] == "failed" and server["log"]["events"].get("fatal", 0) >= 1
    assert server["processes"] == [] and server["stacks"] == []


def test_post_ready_hang(tmp_path: Path, engine) -> None:
    hang = {"running": 255, "waiting": 0, "throughput": 0.0, "tokens_start": 1234567, "interval": 0.3}
    sim = engine("vllm", transcripts.vllm_post_ready_hang(), final="serve", tp=2, work=hang)
    poll(_logged(sim, "Application startup complete"), what="the ready line")
    out = diagnose(tmp_path, sim.name, "--json", nvml=_held_by(sim, 2))
    assert out.returncode == 1, out.stdout + out.stderr
    server = _json(out)
    assert server["verdict"]["status"] == "stalled"
    assert "holds 255 requests" in server["verdict"]["text"] and "no token" in server["verdict"]["text"]
    figures = server["engine_figures"]
    assert figures["source"] == "metrics" and figures["running"] == 255 and figures["tokens_in_window"] == 0
    assert server["port"]["probes"][0]["success"] is True


def test_busy_server_is_healthy(tmp_path: Path, engine) -> None:
    busy = {"running": 12, "waiting": 3, "throughput": 800.0, "interval": 0.3}
    sim = engine("vllm", transcripts.vllm_healthy(), final="serve", tp=2, work=busy)
    poll(_logged(sim, "Avg generation throughput"), what="a stats line")
    out = diagnose(tmp_path, sim.name, nvml=_held_by(sim, 2))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "VERDICT: HEALTHY: serving" in out.stdout and "15 requests in hand" in out.stdout


@pytest.mark.process
def test_unknown_server_and_bad_config_exit_2(tmp_path: Path) -> None:
    out = diagnose(tmp_path, "no-such-server-d12")
    assert out.returncode == 2 and "no watched server named 'no-such-server-d12'" in out.stderr
    out = diagnose(tmp_path, "x", config="servers: 3\n")
    assert out.returncode == 2 and "diagnose.yml" in out.stderr


def test_diagnose_prints_no_escape_sequence_from_argv_paths_or_lines(engine, tmp_path: Path) -> None:
    """Another user's server writes an OSC 52 clipboard write and a CSI sequence that erases the verdict line and
    forges `VERDICT: HEALTHY` into its log, and puts an OSC 0 window title in its stdout file's name, so that
    `stallwatch diagnose` run by root would drive the operator's terminal (docs/research/audit-2026-12-01.md #12).
    The text output holds no control character but newline and tab: the CSI codes are stripped, the OSC ones written
    as `\\xNN` text, and the real verdict (STALLED) stays on its line."""
    lines = t.sglang_until_shards(tp=1) + f"[2026-11-20 09:15:00] {OSC_CLIPBOARD}{CSI_OVERWRITE}\n"
    sim = engine("sglang", lines, final="stall", tp=1, log_name=f"out{OSC_TITLE}.log")
    poll(lambda: sim.log.exists() and "VERDICT" in sim.log.read_text(), what="the hostile line")
    out = diagnose(tmp_path, sim.name)
    assert out.returncode == 1, out.stderr
    assert not [c for c in out.stdout if (ord(c) < 0x20 and c not in "\n\t") or 0x7f <= ord(c) <= 0x9f], out.stdout
    # Shown as text: the OSC of the line (its CSI codes are stripped as colours are) and of the log's path.
    assert "\\x1b]52;c;cm0gLXJmIH4K\\x07VERDICT: HEALTHY" in out.stdout
    assert "out\\x1b]0;OWNED\\x07.log" in out.stdout
    assert out.stdout.splitlines()[1].startswith("VERDICT: STALLED")


DISCOVERY = "discovery: {interval: 1s}\n"  # the exporter's: finds the engine within a second


def _gone(e: Exporter, sim: Engine, stop_requested: float) -> None:
    """Wait until the running exporter has seen `sim`'s main process gone (its phase ended within a second of it),
    with its stop line read or not."""
    sim.proc.wait(30)
    try:
        e.wait_for(lambda s: s.value("stallwatch_startup_phase", server=sim.name, phase="stopped") == 1
                   and s.value("stallwatch_server_stop_requested", server=sim.name) == stop_requested,
                   what=f"{sim.name} gone")
    except AssertionError as exc:  # what the exporter had read, to tell a lost stop line from a late one
        seen = [line for line in e.scrape().text.splitlines() if sim.name in line and "_log_" in line]
        raise AssertionError(f"{exc}\nthe log: {sim.log.read_text()[-600:]!r}\nthe exporter: {seen}") from exc


def test_a_discovered_server_gone_after_a_crash_is_down_by_name(tmp_path: Path, exporter, engine) -> None:
    """Its process gone, nothing of it is left in /proc for diagnose's own look: the running exporter, which keeps it
    until forget_after, answers for it (zero config: no `servers:` lists it)."""
    e = exporter(config=DISCOVERY)
    sim = engine("sglang", transcripts.sglang_until_shards(1, 64), final="stall", tp=1)
    e.wait_for(lambda s: s.value("stallwatch_weight_shards_loaded", server=sim.name) == 64,
               what="the engine discovered and its shards read")
    sim.proc.kill()  # as the OOM killer ends it: no line says why
    _gone(e, sim, stop_requested=0)
    listen = f"--web.listen-address=127.0.0.1:{e.port}"
    out = diagnose(tmp_path, sim.name, listen, config=None)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"from the running exporter at http://127.0.0.1:{e.port}" in out.stdout
    verdict = out.stdout.splitlines()[2]
    assert verdict.startswith("VERDICT: DOWN: main process gone for ") and "last in loading_weights" in verdict
    assert "without a stop request in its log" in verdict
    assert f"log {sim.log}; events of this launch:" in out.stdout
    server = _json(diagnose(tmp_path, sim.name, listen, "--json", config=None))
    assert server["phase"]["phase"] == "stopped" and server["phase"]["timeline"][-2:] == ["loading_weights", "stopped"]
    assert server["identity"]["pid"] == sim.proc.pid


def test_a_discovered_server_stopped_on_request_reads_stopped(tmp_path: Path, exporter, engine) -> None:
    e = exporter(config=DISCOVERY)
    sim = engine("sglang", transcripts.sglang_healthy(1), final="serve", tp=1,
                 on_sigterm=transcripts.real("sglang-sigterm-group-stop.log"))
    e.wait_for(lambda s: s.value("stallwatch_startup_phase", server=sim.name, phase="serving") == 1
               and s.log("stallwatch_log_up", server=sim.name, path=str(sim.log)) == 1,
               what="the engine serving, its log followed")
    sim.terminate()
    _gone(e, sim, stop_requested=1)
    out = diagnose(tmp_path, sim.name, f"--web.listen-address=127.0.0.1:{e.port}", "--json", config=None)
    assert out.returncode == 0, out.stdout + out.stderr
    server = _json(out)
    assert server["verdict"]["status"] == "stopped", server["verdict"]
    assert "stopped on request" in server["verdict"]["text"] and "last in serving" in server["verdict"]["text"]
    assert server["phase"]["stop_requested"] is True and server["identity"]["configured"] is False


def _warming_llamacpp(engine) -> Engine:
    """llama.cpp warming up: its port listens (the kernel accepts) and nothing answers, so its probe times out."""
    lines = transcripts.llamacpp_healthy()
    sim = engine("llamacpp", lines[:lines.index("main: model loaded")], final="hang", tp=1)
    poll(_logged(sim, "warming up the model"), what="the warm-up line")
    return sim


def test_a_sigstopped_server_reads_stopped_process_not_starting(tmp_path: Path, engine) -> None:
    sim = _warming_llamacpp(engine)
    os.kill(sim.proc.pid, signal.SIGSTOP)
    try:
        server = _json(diagnose(tmp_path, sim.name, "--json", config=None))  # log_stale 10 min: no stall by silence
    finally:
        os.kill(sim.proc.pid, signal.SIGCONT)
    assert server["verdict"]["status"] == "stalled", server["verdict"]
    assert f"main process {sim.proc.pid} is stopped (state T" in server["verdict"]["text"]
    assert "in warming_up; the probe fails (timeout)" in server["verdict"]["text"]
    main = next(p for p in server["processes"] if p["role"] == "main")
    assert main["state"] == "T" and server["port"]["probes"][0]["reason"] == "timeout"  # the evidence it prints


def test_diagnose_waits_for_no_timeout_past_its_deadline(tmp_path: Path, engine) -> None:
    """A probe the config lets wait 50 s is cut at diagnose's own deadline (oneshot.LOOK_SECONDS), not waited for."""
    sim = _warming_llamacpp(engine)
    config = "defaults:\n  probe: {timeout: 50s}\n"
    server = _json(diagnose(tmp_path, sim.name, "--json", config=config))
    probe = server["port"]["probes"][0]
    assert probe["reason"] == "timeout" and probe["duration_seconds"] < 50, probe
    assert server["verdict"]["status"] == "starting", server["verdict"]
