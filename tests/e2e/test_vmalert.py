"""The shipped rules past one Prometheus: Debian's vmalert over VictoriaMetrics evaluates them unchanged (issue 31,
item 5). One exporter, scraped by both Prometheus and VictoriaMetrics, watches the seed stall and a healthy idle
server; vmalert fires the same alerts, with the same labels and annotations, as Prometheus, and none for the idle
server."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

from support import transcripts as t
from support.harness import gpus, poll, require
from support.paths import ROOT
from support.seed import STALL_CONFIG, seed_stall_beside_idle
from support.stack import Daemon, Webhook, alertmanager, prometheus, shortened_rules
from support.victoria import victoria_metrics, vmalert, vmalert_alerts

DURATION = re.compile(r"(?:\d+(?:\.\d+)?[dhms]\s?)+")  # humanizeDuration's output: the two read at other times


def test_shipped_rules_parse_under_metricsql() -> None:
    """Every expression and annotation template of the shipped rules, as vmalert reads them (MetricsQL)."""
    result = subprocess.run([require("vmalert"), "-dryRun", f"-rule={ROOT / 'rules' / '*.yml'}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _labels(alert: dict) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in alert.items() if k not in ("__name__", "alertstate")))


def test_vmalert_fires_what_prometheus_fires_and_nothing_for_an_idle_server(
    exporter, engine, daemons: list[Daemon], tmp_path: Path
) -> None:
    folders = {name: tmp_path / name for name in ("prometheus", "vmalert")}
    for folder in folders.values():
        folder.mkdir()
    hooks = {name: Webhook() for name in folders}
    nvml = gpus(10, used=76e9, util=0, power=85, power_limit=700, recovery_action=0, ecc_uncorrected=0)
    e = exporter(nvml={"gpus": nvml}, config=STALL_CONFIG)
    target = f"127.0.0.1:{e.port}"
    query = prometheus(daemons, folders["prometheus"],
                       alertmanager(daemons, folders["prometheus"], hooks["prometheus"]), [target])
    vm = victoria_metrics(daemons, folders["vmalert"], [target])
    rules = folders["vmalert"] / "rules.yml"
    shortened_rules(rules)
    ruler = vmalert(daemons, folders["vmalert"], rules, vm,
                    alertmanager(daemons, folders["vmalert"], hooks["vmalert"]))

    def vm_query(expr: str) -> list[dict]:
        url = f"{vm}/api/v1/query?nocache=1&query=" + urllib.parse.quote(expr)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]["result"]

    poll(lambda: query('up{job="stallwatch"} == 1') and vm_query('up{job="stallwatch"} == 1'), timeout=30,
         what="the first scrape by both")

    stalled, idle = seed_stall_beside_idle(engine, e, nvml, t.sglang_until_shards(tp=8, shards=64))

    pages = {name: poll(lambda h=hook: h.find("InferenceServerLoadedButIdle", stalled.name, "firing"), timeout=90,
                        interval=0.2, what=f"the seed stall's page from {name}")
             for name, hook in hooks.items()}

    def both() -> tuple[set, set]:
        ours = {_labels(a["metric"]) for a in query('ALERTS{alertstate="firing"}')}
        theirs = {_labels(a["labels"]) for a in vmalert_alerts(ruler) if a["state"] == "firing"}
        return ours, theirs

    # vmalert reads a second or two later (its remote-write flush, VictoriaMetrics' latency offset): the same
    # set once both have caught up.
    try:
        poll(lambda: (sets := both()) and sets[0] == sets[1], timeout=45, interval=0.5,
             what="the same firing alerts")
    except AssertionError:
        ours, theirs = both()
        raise AssertionError(f"only Prometheus: {sorted(ours - theirs)}\n"
                             f"only vmalert: {sorted(theirs - ours)}") from None
    fired = sorted(dict(labels)["alertname"] for labels in both()[0] if dict(labels).get("server") == stalled.name)
    print(f"firing for the seed stall in Prometheus and vmalert alike: {', '.join(fired)}")
    assert "InferenceServerLoadedButIdle" in fired, fired

    # The page says the same, but for the durations each read at its own time.
    prom, vic = (pages[name] for name in ("prometheus", "vmalert"))
    assert prom["labels"] == vic["labels"]

    def masked(annotations: dict[str, str]) -> dict[str, str]:
        return {k: DURATION.sub("<d>", v) for k, v in annotations.items()}

    # What the description says of the server is a recorded series of a 1-minute group (stallwatch:server_context):
    # vmalert reads it a flush later, so its first notification may go out before it; its alert says the same once
    # it has it.
    want = masked(prom["annotations"])
    try:
        poll(lambda: next((a for a in vmalert_alerts(ruler) if a["state"] == "firing"
                           and a["labels"].get("alertname") == "InferenceServerLoadedButIdle"
                           and a["labels"].get("server") == stalled.name and masked(a["annotations"]) == want), None),
             timeout=60, interval=0.5, what="vmalert's page saying what Prometheus' says")
    except AssertionError:
        raise AssertionError(f"Prometheus: {want}\nvmalert: {masked(vic['annotations'])}") from None
    assert vic["annotations"]["status_url"].startswith(f"http://{target}/servers/?name=")

    # The healthy idle server: nothing, firing or pending, in either.
    assert query(f'ALERTS{{server="{idle.name}"}}') == []
    assert [a for a in vmalert_alerts(ruler) if a["labels"].get("server") == idle.name] == []
    for hook in hooks.values():
        assert not [a for a in hook.alerts if a["labels"].get("server") == idle.name]
