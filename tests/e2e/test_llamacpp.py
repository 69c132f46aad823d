"""llama.cpp's own llama-server through the real exporter, the shipped rules in a real Prometheus and a real
Alertmanager: its main loop frozen (one thread stopped, /health 200) and the whole process SIGSTOPped each page; a
healthy one without traffic beside them pages nothing (issue 27)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from support.harness import poll
from support.llamacpp import freeze_thread
from support.stack import Daemon, Webhook, alertmanager, prometheus, rule_seconds

CONFIG = ("discovery: {enabled: true, interval: 1s}\n"
          "defaults:\n  probe: {timeout: 1s, interval: 1s}\n"
          "logs: {poll_interval: 0.5s}\n"
          "engine_metrics: {interval: 1s, timeout: 1s}\n")


def test_a_frozen_main_loop_and_a_stopped_process_page_an_idle_server_does_not(
    exporter, llama, daemons: list[Daemon], tmp_path: Path
) -> None:
    hook = Webhook()
    am_port = alertmanager(daemons, tmp_path, hook)
    e = exporter(config=CONFIG)
    query = prometheus(daemons, tmp_path, am_port, [f"127.0.0.1:{e.port}"])
    poll(lambda: query('up{job="stallwatch"} == 1'), timeout=30, what="the first scrape")
    frozen, stopped, idle = (llama(log=tmp_path / f"{name}.log") for name in ("frozen", "stopped", "idle"))
    for server in (frozen, stopped, idle):
        server.wait_healthy()
        server.complete()
        poll(lambda s=server: query(f'stallwatch_engine_loop_up{{server="{s.name}"}} == 1'), timeout=30,
             what=f"{server.name} serving, its loop answering, in Prometheus")
    tracer = freeze_thread(frozen.proc.pid)
    stopped.signal(signal.SIGSTOP)
    froze = time.time()
    try:
        page = poll(lambda: hook.find("InferenceServerEngineLoopStuck", frozen.name, "firing"), timeout=90,
                    interval=0.2, what="the frozen loop's page")
        print(f"frozen main loop: paged {page['received_at'] - froze:.1f} s after it froze "
              f"(window {rule_seconds('2m') * 2:g} s)")
        assert page["labels"]["severity"] == "critical"
        assert page["annotations"]["description"].startswith(f"{frozen.name} on 127.0.0.1:{e.port} answers its "
                                                              "health check, but its engine's main loop")
        assert frozen.healthy()
        poll(lambda: hook.find("InferenceServerProbeFailing", stopped.name, "firing"), timeout=90, interval=0.2,
             what="the stopped process's page")
        # The idle server: serving, no traffic, its log silent: nothing, for the whole run.
        assert query(f'ALERTS{{server="{idle.name}"}}') == []
        assert not [a for a in hook.alerts if a["labels"].get("server") == idle.name]
        assert not hook.find("InferenceServerProbeFailing", frozen.name, "firing")  # its health passes
    finally:
        stopped.signal(signal.SIGCONT)
        tracer.kill()
        tracer.wait()
    poll(lambda: hook.find("InferenceServerEngineLoopStuck", frozen.name, "resolved"), timeout=60, interval=0.5,
         what="the page to resolve once the loop runs again")
