"""End to end through real Prometheus and Alertmanager: each stall pages, healthy idle servers never do."""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from support import transcripts as t
from support.dashboard import DEPLOYMENT_ROW, PD_ROW
from support.dashboard import queries as dashboard_queries
from support.harness import gpus, poll, require
from support.paths import ROOT
from support.sandbox import Pod
from support.seed import EXPORTER_CONFIG, STALL_CONFIG, STALL_LOG_STALE, pids_with_titles, seed_stall_beside_idle
from support.stack import (
    PIPELINE,
    Daemon,
    Webhook,
    alertmanager,
    prometheus,
    rule_seconds,
    shortened_rules,
)

ENGINE_PANEL = "Engine: "  # the title prefix of the dashboard's panels of the engine's own view


def paged_after_silence(hook: Webhook, alertname: str, server: str, last_line: float, what: str) -> dict:
    """The critical page for `server`, never before log_stale after its last log line. The latency promise (within
    log_stale + 2 minutes, scaled, + the unscaled pipeline) is printed, not asserted: a loaded machine moves it, and
    the rules' own timing is promtool's test (tests/shipped/test_rules.py)."""
    page = poll(lambda: hook.find(alertname, server, "firing"), timeout=90, interval=0.2, what=f"the {what}'s page")
    latency = page["received_at"] - last_line
    print(f"{what}: paged {latency:.1f} s after the last log line (log_stale {STALL_LOG_STALE:g} s, "
          f"promise {STALL_LOG_STALE + rule_seconds('2m') + PIPELINE:g} s)")
    assert latency >= STALL_LOG_STALE
    assert page["labels"]["severity"] == "critical"
    return page


def _status_page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return response.read().decode()


def test_shortened_rules_scale_every_window(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    shortened_rules(path)
    shipped = yaml.safe_load((ROOT / "rules" / "stallwatch.rules.yml").read_text())
    ours = yaml.safe_load(path.read_text())
    for rule in (r for g in ours["groups"] for r in g["rules"]):
        assert not re.search(r"\[\d+[mh]\]|offset \d+[mh]", rule["expr"]), f"a window left at real time: {rule}"
    loaded = {r["alert"]: r for g in ours["groups"] for r in g["rules"] if "alert" in r}
    assert loaded["InferenceServerLoadedButIdle"]["for"] == "2s"
    assert "[10s]" in loaded["InferenceServerLoadedButIdle"]["expr"]
    assert "[4s]" in loaded["InferenceServerNoTokenProgress"]["expr"]
    assert [r.get("record") or r["alert"] for g in shipped["groups"] for r in g["rules"]] == \
        [r.get("record") or r["alert"] for g in ours["groups"] for r in g["rules"]]
    result = subprocess.run([require("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stall_pages_idle_server_does_not_and_restart_resolves(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    # Exporter and Prometheus first, so that the windows are full of samples when the stall begins (a stall that
    # began before Prometheus watched is the "exporter just started" case of the promtool tests).
    nvml = gpus(10, used=76e9, util=0, power=85, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=STALL_CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    transcript = t.sglang_until_shards(tp=8, shards=64)
    # vLLM always serves its /metrics: 0 running, 0 waiting, its counter still.
    stalled, idle = seed_stall_beside_idle(engine, e, nvml, transcript)
    poll(lambda: stalled.log.stat().st_size >= len(transcript.encode()), timeout=30, what="the stall's last line")
    last_line = stalled.log.stat().st_mtime

    page = paged_after_silence(hook, "InferenceServerLoadedButIdle", stalled.name, last_line, "seed stall")
    assert page["labels"]["instance"] == f"127.0.0.1:{e.port}"
    notes = page["annotations"]
    assert notes["summary"] and notes["runbook_url"].endswith("#inferenceserverloadedbutidle")
    assert f"{stalled.name} on 127.0.0.1:{e.port} holds 69.85GiB" in notes["description"]
    assert "phase loading_weights, health probe failing" in notes["description"]
    # The exporter's page for the server, on the host:port Prometheus scrapes, says what the page says.
    assert notes["status_url"] == (f"http://127.0.0.1:{e.port}/servers/"
                                   f"?name={urllib.parse.quote_plus(page['labels']['server'], safe='')}")
    assert "STALLED: loaded but idle" in _status_page(notes["status_url"])

    def alerts_for(server: str) -> list[dict]:
        return query(f'ALERTS{{server="{server}"}}')

    # Every dashboard panel shows data for the stall (no empty panel during an incident).
    empty = [title for title, expr in dashboard_queries(exclude_rows={DEPLOYMENT_ROW, PD_ROW}) if not query(expr)]
    assert empty == [], f"dashboard panels without data: {empty}"

    # The healthy server without traffic: GPU full, idle, log silent, probe OK, serving: nothing at all.
    assert alerts_for(idle.name) == []
    assert not [a for a in hook.alerts if a["labels"].get("server") == idle.name]

    # Restart the stalled server; it comes up and serves: the page resolves.
    stalled.stop()
    restarted = engine("sglang", t.sglang_healthy(tp=2), final="serve", tp=2, port=stalled.port,
                       log_name="restarted.log")
    assert restarted.name == stalled.name
    poll(lambda: hook.find("InferenceServerLoadedButIdle", stalled.name, "resolved"), timeout=60, interval=0.5,
         what="the page to resolve")
    assert alerts_for(idle.name) == []
    assert not [a for a in hook.alerts if a["labels"].get("server") == idle.name]


def test_post_ready_hang_pages_idle_and_busy_servers_do_not(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    """vLLM #23378: serving, /health 200, 255 requests running, the token counter on /metrics frozen and the stats
    line saying `Avg generation throughput: 0.0 tokens/s` every interval. Beside it a healthy idle server (0
    running, 0 waiting) and a busy one (tokens flowing): neither pages."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    e = exporter(nvml={"gpus": gpus(2, used=1e9, util=0)}, config=EXPORTER_CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    # The hang: the counter never moves from tokens_start, so its last token is when the engine began serving,
    # which is at most the time the simulator has printed its (instant) transcript.
    hung = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1,
                  work={"running": 255, "waiting": 0, "throughput": 0.0, "tokens_start": 1234567, "interval": 0.5})
    last_token = time.time()
    idle = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1,
                  work={"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 99, "interval": 0.5})
    busy = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1,
                  work={"running": 12, "waiting": 3, "throughput": 800.0, "interval": 0.5})

    page = poll(lambda: hook.find("InferenceServerNoTokenProgress", hung.name, "firing"), timeout=60,
                interval=0.2, what="the post-ready hang's page")
    latency = page["received_at"] - last_token
    window = rule_seconds("2m") + rule_seconds("1m")  # token window + `for`
    print(f"post-ready hang: paged {latency:.1f} s after its last token (promise {rule_seconds('5m') + PIPELINE:g} s)")
    assert latency >= window
    assert page["labels"]["severity"] == "critical"
    assert page["annotations"]["description"].startswith(
        f"{hung.name} on 127.0.0.1:{e.port} has had 255 or more requests running or waiting and has generated no "
        "token for 3 minutes (figures from its /metrics page); health probe passing.")
    assert page["annotations"]["runbook_url"].endswith("#inferenceservernotokenprogress")

    # The engine's panels show the hang: tokens/s, running, waiting, figures' age.
    empty = [title for title, expr in dashboard_queries() if title.startswith(ENGINE_PANEL) and not query(expr)]
    assert empty == [], f"engine panels without data: {empty}"
    rate = query(f'rate(stallwatch_engine_generated_tokens_total{{server="{busy.name}",source="metrics"}}[5s])')
    assert rate and float(rate[0]["value"][1]) > 0

    # Idle and busy stay silent for the whole run (several token windows long by now).
    time.sleep(rule_seconds("2m"))
    for server in (idle.name, busy.name):
        assert query(f'ALERTS{{server="{server}"}}') == [], server
        assert not [a for a in hook.alerts if a["labels"].get("server") == server], server


@pytest.mark.root
def test_containerized_stall_pages_and_containerized_idle_server_does_not(
    exporter, daemons: list[Daemon], tmp_path: Path
) -> None:
    """The same promise for servers in pods: each in its own network namespace and cgroup, stdout on a pipe
    into a CRI log. The stall binds 127.0.0.1 inside its pod (SGLang's default) and never opens its port, so no
    probe can be made; the idle vLLM binds all interfaces and is probed at its pod IP."""
    with contextlib.ExitStack() as stack:
        stalled = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=4, shards=64),
                                          namespace="llm", pod="kimi-0", final="stall", tp=4, host="127.0.0.1"))
        idle = stack.enter_context(Pod(tmp_path, "vllm", t.vllm_healthy(tp=1), namespace="llm", pod="llama-0",
                                       final="serve", tp=1, port=8000, host="0.0.0.0",
                                       work={"running": 0, "waiting": 0, "throughput": 0.0, "interval": 0.5}))
        hook = Webhook()
        am_port = alertmanager(daemons, tmp_path, hook)
        nvml = gpus(6, used=76e9, util=0)
        e = exporter(nvml={"gpus": nvml}, config=EXPORTER_CONFIG, args=(f"--path.rootfs={tmp_path / 'root'}",))
        tp = poll(lambda: pids_with_titles(stalled.pid, "sglang::scheduler_TP", 4), timeout=30, what="schedulers")
        core = poll(lambda: pids_with_titles(idle.pid, "VLLM::EngineCore", 1), timeout=30, what="EngineCore")
        for gpu, pid in enumerate(tp + core + core):
            nvml[gpu]["processes"] = [{"pid": pid, "used": 75e9}]
        e.nvml.update(gpus=nvml)
        query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])

        page = poll(lambda: hook.find("InferenceServerLoadedButIdle", "llm/kimi-0", "firing"), timeout=90,
                    interval=0.5, what="the page for the pod")
        description = page["annotations"]["description"]
        assert "phase loading_weights, health probe absent, port not listening." in description
        # Go's `urlquery` escapes the pod name's slash; the page is found all the same.
        assert page["annotations"]["status_url"] == f"http://127.0.0.1:{e.port}/servers/?name=llm%2Fkimi-0"
        assert "<h1>llm/kimi-0</h1>" in _status_page(page["annotations"]["status_url"])
        assert "Model moonshotai/Kimi-K2-Instruct, TP 4, kubernetes pod llm/kimi-0." in description
        # The idle pod serves, probed at its own address, its /metrics fetched there: nothing at all, for the
        # whole run.
        assert query(f'stallwatch_probe_success{{server="llm/llama-0"}} == 1 and on (server, probe) '
                     f'stallwatch_probe_info{{url="http://{idle.address}:8000/health"}}')
        assert query('stallwatch_engine_metrics_up{server="llm/llama-0"} == 1')
        assert query('ALERTS{server="llm/llama-0"}') == []
        assert not [a for a in hook.alerts if a["labels"].get("server") == "llm/llama-0"]


def test_crash_loop_pages_within_ten_minutes(exporter, engine, daemons: list[Daemon], tmp_path: Path) -> None:
    """A server that fails in graph capture, under a supervisor that relaunches it each time it exits (systemd
    `Restart=always`, Docker's restart policy): each failure and each absence is short, so only
    InferenceServerCrashLooping can page, within 10 (scaled) minutes of the first launch, naming the last notable
    line's kind."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    e = exporter(nvml={"gpus": gpus(2, used=1e9, util=0)}, config=EXPORTER_CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    first_launch = time.time()
    looping = engine("sglang", t.sglang_graph_crash(tp=2), final="crash", tp=2, line_delay=0.05,
                     supervise={"restart_sec": 0.5, "max_restarts": 40})
    page = poll(lambda: hook.find("InferenceServerCrashLooping", looping.name, "firing"), timeout=60, interval=0.2,
                what="the crash loop's page")
    latency = page["received_at"] - first_launch
    print(f"crash loop: paged {latency:.1f} s after its first launch (promise {rule_seconds('10m') + PIPELINE:g} s)")
    assert page["labels"]["severity"] == "critical"
    description = page["annotations"]["description"]
    assert description.startswith(f"{looping.name} on 127.0.0.1:{e.port} relaunched "), description
    assert "served in none of them; the last notable line was fatal" in description
    assert page["annotations"]["runbook_url"].endswith("#inferenceservercrashlooping")


def test_collective_hang_pages_a_capture_that_draws_power_and_an_idle_spin_do_not(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    """A graph capture that hangs in a collective: its GPUs read 100 % at 70 W of 700 (nccl#968) and its log
    stops at the capture's begin line; it pages within log_stale + 2 (scaled) minutes of that line. Beside it a
    capture as silent whose GPUs draw 450 W in bursts, and a healthy idle server whose GPUs spin at 80 W
    (sglang#6085) but which serves and passes its probe: neither raises anything."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    nvml = gpus(6, used=76e9, util=100, power=70, power_limit=700)
    for gpu, watts in ((2, 90), (3, 90), (4, 80), (5, 80)):
        nvml[gpu]["power"] = watts
    e = exporter(nvml={"gpus": nvml},
                 config=STALL_CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")

    transcript = t.sglang_until_capture(tp=2)
    hung = engine("sglang", transcript, final="stall", tp=2)
    capture = engine("sglang", transcript, final="stall", tp=2)
    idle = engine("sglang", t.sglang_healthy(tp=2), final="serve", tp=2)
    for first, server in ((0, hung), (2, capture), (4, idle)):
        ranks = poll(lambda s=server: pids_with_titles(s.proc.pid, "sglang::scheduler_TP", 2), timeout=30,
                     what=f"{server.name}'s schedulers")
        for gpu, pid in enumerate(ranks, start=first):
            nvml[gpu]["processes"] = [{"pid": pid, "used": 75e9}]
    e.nvml.update(gpus=nvml)
    poll(lambda: hung.log.stat().st_size >= len(transcript.encode()), timeout=30, what="the hang's last line")
    last_line = hung.log.stat().st_mtime

    stop = threading.Event()

    def bursts() -> None:  # the working capture: 450 W for a second and a half of every three
        while not stop.wait(1.5):
            for gpu in (2, 3):
                nvml[gpu]["power"] = 450 if nvml[gpu]["power"] == 90 else 90
            e.nvml.update(gpus=nvml)

    burster = threading.Thread(target=bursts, daemon=True)
    burster.start()
    try:
        page = paged_after_silence(hook, "InferenceServerStuckInCollective", hung.name, last_line, "collective hang")
        description = page["annotations"]["description"]
        assert description.startswith(f"{hung.name} on 127.0.0.1:{e.port}: its GPUs have been busy "), description
        assert "(phase capturing_graphs): NCCL kernels spin waiting for a peer" in description
        assert page["annotations"]["runbook_url"].endswith("#inferenceserverstuckincollective")
        assert "STALLED: busy-waiting" in _status_page(page["annotations"]["status_url"])
        # The idle alert cannot see it: the GPUs are busy.
        assert not hook.find("InferenceServerLoadedButIdle", hung.name, "firing")

        # The working capture and the idle spin stay silent for two more (scaled) minutes, as long as the hang
        # took to page after its log_stale.
        time.sleep(rule_seconds("2m"))
        for server in (capture.name, idle.name):
            assert query(f'ALERTS{{server="{server}"}}') == [], server
            assert not [a for a in hook.alerts if a["labels"].get("server") == server], server
        # Polled: a scrape or an evaluation late on a loaded machine leaves the recorded series out of one query.
        poll(lambda: {s["metric"]["server"] for s in query("stallwatch:server_gpu_spinning_ratio:max")}
             == {hung.name, idle.name}, timeout=30, what="the hang and the idle spin recorded as spinning")
    finally:
        stop.set()
        burster.join()


def test_driver_hang_pages_gpu_fault_naming_the_server_the_gpu_and_the_xid(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    """The driver hang (Xid 119, a GSP RPC timeout): every NVML call on GPU 0 blocks for 45 s
    (open-gpu-kernel-modules#446), so the exporter reads it down and withholds its values, and the 119 comes from
    NVML's event API. InferenceServerGpuFault pages the server that held memory on GPU 0, naming the GPU, its UUID
    and the Xid; the server on GPU 1, which answers, is not paged (audit 2026-12-02 #3)."""
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    nvml = gpus(2, used=76e9, util=0, power=85, power_limit=700, recovery_action=0)
    e = exporter(nvml={"gpus": nvml}, config=EXPORTER_CONFIG + "gpu: {sample_interval: 0.2s, timeout: 2s}\n")
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")
    hung = engine("sglang", t.sglang_healthy(tp=1), final="serve", tp=1)
    other = engine("sglang", t.sglang_healthy(tp=1), final="serve", tp=1)
    for gpu, server in enumerate((hung, other)):
        nvml[gpu]["processes"] = [{"pid": server.proc.pid, "used": 75e9}]
    e.nvml.update(gpus=nvml)
    poll(lambda: query(f'stallwatch_server_gpu_memory_used_bytes{{server="{hung.name}",gpu="0"}}'), timeout=30,
         what="the server's memory on GPU 0 in Prometheus")
    cleanup = [{"id": "45", "gpu": 0, "data": 45}]  # Xid 45 (cleanup, never alerted on): GPU 0's events registered
    e.nvml.update(events=cleanup)
    e.wait_for(lambda s: s.value("stallwatch_gpu_xid_errors_total", gpu="0", xid="45") == 1, what="Xid 45")

    # The hang, then its 119 once the GPU reads down (the driver logs it when the RPC times out): the server's
    # memory on GPU 0 is withheld by then, and the page joins the 119 to what it held in the last readings.
    nvml[0]["block"] = 45
    e.nvml.update(gpus=nvml)
    poll(lambda: query(f'stallwatch_gpu_up{{gpu="0",uuid="{nvml[0]["uuid"]}"}} == 0')
         and not query('stallwatch_server_gpu_memory_used_bytes{gpu="0"}'), timeout=30,
         what="GPU 0 down under its own uuid, its memory withheld")
    e.nvml.update(events=[*cleanup, {"id": "119", "gpu": 0, "data": 119}])
    posted = time.time()
    page = poll(lambda: hook.find("InferenceServerGpuFault", hung.name, "firing"), timeout=60, interval=0.2,
                what="the GPU fault's page")
    print(f"driver hang: paged {page['received_at'] - posted:.1f} s after the Xid 119 was posted")
    labels, uuid = page["labels"], nvml[0]["uuid"]
    assert (labels["severity"], labels["gpu"], labels["uuid"]) == ("critical", "0", uuid)
    description = page["annotations"]["description"]
    assert description.startswith(
        f"{hung.name} on 127.0.0.1:{e.port} held memory on GPU 0 ({uuid}) in its last readings; the GPU does not "
        "answer NVML now and reported Xid 119 (a GSP RPC timeout: its firmware stopped answering; reset the GPU or "
        "reboot) "), description
    assert "nvidia-smi -r -i 0" in description
    assert not [a for a in hook.alerts if a["labels"].get("server") == other.name], other.name
    # The server's status page says it too: GPU 0 from its last answer, with its fault.
    status = _status_page(page["annotations"]["status_url"])
    assert f"FAILED: GPU 0 ({uuid}) reported Xid 119 x1 " in status, status
    assert "and it does not answer NVML now" in status and "DOES NOT ANSWER NVML" in status
