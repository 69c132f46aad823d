"""The real Prometheus and Alertmanager of the end-to-end tests, the webhook that receives Alertmanager's
notifications, and the time compression of the shipped rules (tests/e2e/test_alerts.py, tests/e2e/test_multinode.py)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from support.harness import free_port, poll, require
from support.paths import ROOT


class Webhook:
    def __init__(self) -> None:
        self.alerts: list[dict] = []  # every alert of every notification, with its group's labels and receiver
        self.notifications: list[dict] = []  # the notifications as Alertmanager posted them
        received, notifications = self.alerts, self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.time()
                notifications.append(body)
                received.extend({**alert, "received_at": now, "group": body["groupLabels"],
                                 "receiver": body["receiver"]} for alert in body["alerts"])
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


# Time compression: one minute of the shipped rules lasts SCALE seconds here. Every `for:` and every range or
# offset in an expression (`[5m]`, `offset 2m`) is rewritten by scaled(), so the windows keep their proportions
# (the 5m idle window becomes 10 s, the 2m token window 4 s, a 1m `for` 2 s) and the test runs in seconds.
# Not rewritten: numbers of seconds compared in expressions (the engine figures count while under 60 s old: the
# exporter here refreshes them every second) and annotation templates. Thresholds such as log_stale come from
# the exporter's config. What does not scale: discovery, scrape, evaluation (1 s each here) and Alertmanager's
# 1 s group_wait; PIPELINE bounds what they add to a page.
SCALE = 2.0
PIPELINE = 5.0
_DURATION = re.compile(r"(\d+)([smh])")
_WINDOW = re.compile(r"\[(\d+[smh])\]|offset (\d+[smh])")


def rule_seconds(duration: str) -> float:
    """How many seconds a duration of the shipped rules ("5m") lasts here (10.0)."""
    value, unit = _DURATION.fullmatch(duration).groups()  # type: ignore[union-attr]
    return int(value) * {"s": 1, "m": 60, "h": 3600}[unit] * SCALE / 60


def scaled(duration: str) -> str:
    """A duration of the shipped rules ("5m") as it lasts here ("10s")."""
    millis = round(rule_seconds(duration) * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def shortened_rules(path: Path) -> None:
    """The shipped rules, time compressed by SCALE (see above)."""
    rules = yaml.safe_load((ROOT / "rules" / "stallwatch.rules.yml").read_text())
    for group in rules["groups"]:
        if "interval" in group:  # the pages every 15 s, the slow alerts every minute: as much faster
            group["interval"] = scaled(group["interval"])
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = scaled(rule["for"])
            rule["expr"] = _WINDOW.sub(lambda m: f"[{scaled(m.group(1))}]" if m.group(1)
                                       else f"offset {scaled(m.group(2))}", rule["expr"])
    path.write_text(yaml.safe_dump(rules, sort_keys=False))


def alertmanager(daemons: list[Daemon], tmp_path: Path, hook: Webhook, shipped: bool = False) -> int:
    """A real Alertmanager routing every alert to `hook` at once; its port. `shipped`: with the routes, grouping
    and inhibitions of deploy/prometheus/alertmanager.yml, each of its receivers posting to `hook`, its waits 1 s."""
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    hooked = [{"url": hook.url, "send_resolved": True}]
    if shipped:
        routing = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alertmanager.yml").read_text())
        routing["receivers"] = [{"name": r["name"], "webhook_configs": hooked} for r in routing["receivers"]]
        routing["route"].update(group_wait="1s", group_interval="1s")
        routes = list(routing["route"].get("routes", []))
        while routes:  # a child route's own waits too
            route = routes.pop()
            route.update({key: "1s" for key in ("group_wait", "group_interval") if key in route})
            routes.extend(route.get("routes", []))
    else:
        routing = {"route": {"receiver": "hook", "group_by": ["alertname", "server"], "group_wait": "1s",
                             "group_interval": "1s", "repeat_interval": "1h"},
                   "receivers": [{"name": "hook", "webhook_configs": hooked}]}
    config.write_text(yaml.safe_dump(routing))
    daemons.append(Daemon([require("prometheus-alertmanager"), f"--config.file={config}",
                           f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
                           "--cluster.listen-address="],
                          tmp_path / "alertmanager.log", f"http://127.0.0.1:{port}/-/ready"))
    return port


def prometheus(daemons: list[Daemon], tmp_path: Path, am_port: int, targets: list[str]) -> Callable[[str], list]:
    """A real Prometheus scraping the exporters at `targets` (host:port) every second with the shipped rules; its
    query function."""
    port = free_port()
    rules = tmp_path / "rules.yml"
    shortened_rules(rules)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "stallwatch",
                            "static_configs": [{"targets": targets}]}],
    }))
    daemons.append(Daemon([require("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                           f"--web.listen-address=127.0.0.1:{port}"],
                          tmp_path / "prometheus.log", f"http://127.0.0.1:{port}/-/ready"))

    def query(expr: str) -> list[dict]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?query=" + urllib.parse.quote(expr)) as r:
            return json.load(r)["data"]["result"]

    return query
