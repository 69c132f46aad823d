"""End to end: simulated engines -> stallwatch (fake NVML) -> real Prometheus (shipped rules) -> real
Alertmanager -> a webhook in this test. The seed stall pages, a healthy idle server stays silent, and the
page resolves once the stalled server is restarted and serves."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
import yaml

import transcripts as t
from conftest import require
from harness import ROOT, free_port, gpus, poll
from sandbox import Pod, require_root
from test_dashboard import queries as dashboard_queries

pytestmark = pytest.mark.e2e


class Webhook:
    def __init__(self) -> None:
        self.alerts: list[dict] = []
        received = self.alerts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received.extend(body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def find(self, alertname: str, server: str, status: str) -> dict | None:
        return next((a for a in list(self.alerts) if a["labels"].get("alertname") == alertname
                     and a["labels"].get("server") == server and a["status"] == status), None)


class Daemon:
    def __init__(self, cmd: list[str], log: Path, ready_url: str) -> None:
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        self.log = log

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited: {log.read_text()[-3000:]}")
            return urllib.request.urlopen(ready_url, timeout=2).status == 200

        poll(ready, timeout=30, what=f"{cmd[0]} to be ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in reversed(started):
        d.stop()


def shortened_rules(path: Path) -> None:
    """The shipped rules with every `for:` cut to 2 s, so the test runs in seconds, not minutes."""
    rules = yaml.safe_load((ROOT / "rules" / "stallwatch.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))


def alertmanager(daemons: list[Daemon], tmp_path: Path, hook: Webhook) -> int:
    """A real Alertmanager routing every alert to `hook` at once; its port."""
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump({
        "route": {"receiver": "hook", "group_by": ["alertname", "server"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook.url, "send_resolved": True}]}],
    }))
    daemons.append(Daemon([require("prometheus-alertmanager"), f"--config.file={config}",
                           f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
                           "--cluster.listen-address="],
                          tmp_path / "alertmanager.log", f"http://127.0.0.1:{port}/-/ready"))
    return port


def prometheus(daemons: list[Daemon], tmp_path: Path, am_port: int, exporter_port: int) -> Callable[[str], list]:
    """A real Prometheus scraping the exporter every second with the shipped rules; its query function."""
    port = free_port()
    rules = tmp_path / "rules.yml"
    shortened_rules(rules)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "stallwatch",
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}],
    }))
    daemons.append(Daemon([require("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                           f"--web.listen-address=127.0.0.1:{port}"],
                          tmp_path / "prometheus.log", f"http://127.0.0.1:{port}/-/ready"))

    def query(expr: str) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query=" + urllib.parse.quote(expr)) as r:
            return json.load(r)["data"]["result"]

    return query


def pids_with_titles(main: int, prefix: str, count: int) -> list[int]:
    """The pids of `main`'s children titled `prefix...`, in rank order, once all `count` are there."""
    found = {p.cmdline()[0]: p.pid for p in psutil.Process(main).children(recursive=True)
             if p.cmdline() and p.cmdline()[0].startswith(prefix)}
    return [found[k] for k in sorted(found, key=lambda k: int(re.sub(r"\D", "", k) or 0))] \
        if len(found) == count else []


EXPORTER_CONFIG = ("discovery: {enabled: true, interval: 1s}\n"
                   "defaults:\n  stall: {gpu_memory_bytes: 70e9, log_stale: 3s}\n"
                   "  probe: {timeout: 1s, interval: 1s}\n"
                   "logs: {poll_interval: 0.5s}\n")


def test_stall_pages_idle_server_does_not_and_restart_resolves(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    started = time.monotonic()
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)

    stalled = engine("sglang", t.sglang_until_shards(tp=8, shards=64), final="stall", tp=8)
    idle = engine("vllm", t.vllm_healthy(tp=1), final="serve", tp=1)
    nvml = gpus(10, used=76e9, util=0)
    e = exporter(nvml={"gpus": nvml}, config=EXPORTER_CONFIG)

    tp = poll(lambda: pids_with_titles(stalled.proc.pid, "sglang::scheduler_TP", 8), timeout=30, what="8 schedulers")
    core = poll(lambda: pids_with_titles(idle.proc.pid, "VLLM::EngineCore", 1), timeout=30, what="EngineCore")
    for gpu, pid in enumerate(tp + core + core):  # TP ranks on GPUs 0-7, the idle server on 8 and 9
        nvml[gpu]["processes"] = [{"pid": pid, "used": 75e9}]
    e.nvml.update(gpus=nvml)
    query = prometheus(daemons, tmp_path, am_port, e.port)

    page = poll(lambda: hook.find("InferenceServerLoadedButIdle", stalled.name, "firing"), timeout=90,
                interval=0.5, what="the page at the webhook")
    assert page["labels"]["severity"] == "critical"
    assert page["labels"]["instance"] == f"127.0.0.1:{e.port}"
    notes = page["annotations"]
    assert notes["summary"] and notes["runbook_url"].endswith("#inferenceserverloadedbutidle")
    assert f"{stalled.name} on 127.0.0.1:{e.port} holds 69.85GiB" in notes["description"]
    assert "phase loading_weights, health probe failing" in notes["description"]

    def alerts_for(server: str) -> list[dict]:
        return query(f'ALERTS{{server="{server}"}}')

    # Every dashboard panel shows data for the stall (no empty panel during an incident).
    empty = [title for title, expr in dashboard_queries() if not query(expr)]
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
    assert time.monotonic() - started < 180


def test_containerized_stall_pages_and_containerized_idle_server_does_not(
    exporter, daemons: list[Daemon], tmp_path: Path
) -> None:
    """The same promise for servers in pods: each in its own network namespace and cgroup, stdout on a pipe
    into a CRI log. The stall binds 127.0.0.1 inside its pod (SGLang's default) and never opens its port, so no
    probe can be made; the idle vLLM binds all interfaces and is probed at its pod IP."""
    require_root()
    with contextlib.ExitStack() as stack:
        stalled = stack.enter_context(Pod(tmp_path, "sglang", t.sglang_until_shards(tp=4, shards=64),
                                          namespace="llm", pod="kimi-0", final="stall", tp=4, host="127.0.0.1"))
        idle = stack.enter_context(Pod(tmp_path, "vllm", t.vllm_healthy(tp=1), namespace="llm", pod="llama-0",
                                       final="serve", tp=1, port=8000, host="0.0.0.0"))
        hook = Webhook()
        am_port = alertmanager(daemons, tmp_path, hook)
        nvml = gpus(6, used=76e9, util=0)
        e = exporter(nvml={"gpus": nvml}, config=EXPORTER_CONFIG, args=(f"--path.rootfs={tmp_path / 'root'}",))
        tp = poll(lambda: pids_with_titles(stalled.pid, "sglang::scheduler_TP", 4), timeout=30, what="schedulers")
        core = poll(lambda: pids_with_titles(idle.pid, "VLLM::EngineCore", 1), timeout=30, what="EngineCore")
        for gpu, pid in enumerate(tp + core + core):
            nvml[gpu]["processes"] = [{"pid": pid, "used": 75e9}]
        e.nvml.update(gpus=nvml)
        query = prometheus(daemons, tmp_path, am_port, e.port)

        page = poll(lambda: hook.find("InferenceServerLoadedButIdle", "llm/kimi-0", "firing"), timeout=90,
                    interval=0.5, what="the page for the pod")
        description = page["annotations"]["description"]
        assert "phase loading_weights, health probe absent, port not listening." in description
        assert "Model moonshotai/Kimi-K2-Instruct, TP 4, kubernetes pod llm/kimi-0." in description
        # The idle pod serves, probed at its own address: nothing at all, for the whole run.
        assert query(f'stallwatch_probe_success{{server="llm/llama-0",url="http://{idle.address}:8000/health"}}')
        assert query('ALERTS{server="llm/llama-0"}') == []
        assert not [a for a in hook.alerts if a["labels"].get("server") == "llm/llama-0"]
