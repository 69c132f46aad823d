"""Debian's VictoriaMetrics and vmalert for the end-to-end tests (tests/e2e/test_vmalert.py): the shipped rules past
one Prometheus, unchanged but for the time compression every e2e test applies (support.stack.shortened_rules)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import yaml

from support.harness import free_port, require
from support.stack import Daemon


def victoria_metrics(daemons: list[Daemon], tmp_path: Path, targets: list[str]) -> str:
    """Single-node VictoriaMetrics scraping the exporters at `targets` every second as job `stallwatch` (its own
    Prometheus-style scraper); its URL. `-search.latencyOffset=1s`: its default 30 s hides the newest samples
    from every instant query, which at this test's time compression would be 15 minutes of the rules' time."""
    port = free_port()
    config = tmp_path / "vm-scrape.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "stallwatch", "static_configs": [{"targets": targets}]}],
    }))
    url = f"http://127.0.0.1:{port}"
    daemons.append(Daemon([require("victoria-metrics"), f"-httpListenAddr=127.0.0.1:{port}",
                           f"-storageDataPath={tmp_path / 'vm'}", "-retentionPeriod=1d",
                           f"-promscrape.config={config}", "-search.latencyOffset=1s"],
                          tmp_path / "victoria-metrics.log", f"{url}/health"))
    return url


def vmalert(daemons: list[Daemon], tmp_path: Path, rules: Path, datasource: str, am_port: int) -> str:
    """vmalert evaluating `rules` every second against `datasource`, its recording rules and alert state written
    back there (`-remoteWrite.url`, mandatory with recording rules) and read back on a restart
    (`-remoteRead.url`), notifying the Alertmanager at `am_port`; its URL. `-disableAlertgroupLabel`: without it
    every alert carries `alertgroup`, and an Alertmanager fed by both Prometheus and vmalert sees two alerts."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    daemons.append(Daemon([require("vmalert"), f"-httpListenAddr=127.0.0.1:{port}", f"-rule={rules}",
                           f"-datasource.url={datasource}", f"-remoteWrite.url={datasource}",
                           f"-remoteRead.url={datasource}", "-remoteWrite.flushInterval=1s",
                           "-evaluationInterval=1s", "-disableAlertgroupLabel",
                           f"-notifier.url=http://127.0.0.1:{am_port}"],
                          tmp_path / "vmalert.log", f"{url}/health"))
    return url


def vmalert_alerts(url: str) -> list[dict]:
    """vmalert's active alerts (`/api/v1/alerts`): each with `labels` (alertname among them), `state`, `value`,
    `annotations`."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=10) as response:
        return json.load(response)["data"]["alerts"]
