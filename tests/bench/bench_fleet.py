"""The shipped rules on a fleet: rule-group evaluation time, head series, Prometheus' RSS and the alerts that fired
against the fleet's ground truth, through Debian's real Prometheus (issue 31).

`--nodes` nodes of 8 GPUs (tests/support/fleet.py: the series of a live exporter scrape, values from a model of each
node's state). One page server on loopback serves every node's current page at /node/<i>/metrics; Prometheus scrapes
each as its own target (instance node-NNNN:9847, job stallwatch) every 15 s and evaluates rules/*.yml every 15 s.
Meanwhile `--history-minutes` (default 2 h) up to its start are written as OpenMetrics in chunks of 50 nodes by
`--jobs` processes (half the CPUs), turned into blocks by `promtool tsdb create-blocks-from openmetrics` and moved
into Prometheus' data folder, which loads them within a minute. It measures once every `for` has had time to run
out on live evaluations (`--live-minutes`) and the history is loaded, prints the figures, then stops everything and
removes its folder. Exit status 1: an alert was false or missed.

    .venv/bin/python tests/bench/bench_fleet.py --nodes 1000 [--history-minutes 120] [--live-minutes 12] [--jobs 4]
                                                [--hold-minutes 30]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support import fleet
from support.harness import free_port, poll, require
from support.paths import ROOT

CHUNK = 50  # nodes per OpenMetrics file: ~0.6 GB of text, what promtool maps at once
COSTLY = 0.005  # seconds: a rule's last evaluation this long is printed by name
METRICS_FAILURES = 0.002  # /metrics fetches that fail for one scrape: `up` 0 once, which must not page


def fetch_fails(index: int, step: int) -> bool:
    """Whether node `index`'s page fails in scrape step `step`. Prometheus then marks the node's series stale, so
    an alert of the node that was pending starts its `for` again: the report tells such an alert (one whose node's
    `up` was 0 within its `for`) from a missed one."""
    return hash((index, step)) % 1000 < METRICS_FAILURES * 1000
WINDOW = "5m"  # the window of the figures
IDLE_WINDOW = 300  # seconds: the rules' idle window (rules/stallwatch.rules.yml, `[5m]` with `offset 5m`)


class Pages(ThreadingHTTPServer):
    abandoned = 0  # pages whose scrape timed out before they were written: this machine too slow for the fleet


def serve_pages(pages: list[fleet.Page]) -> Pages:
    """Every node's page at /node/<i>/metrics, its values at the time of the request."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            match = re.fullmatch(r"/node/(\d+)/metrics", self.path)
            index = int(match.group(1)) if match else -1
            now = time.time()
            if not 0 <= index < len(pages) or fetch_fails(index, int(now // fleet.STEP)):
                self.send_response(503 if match else 404)
                self.end_headers()
                return
            body = fleet.exposition(pages[index], now).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the scrape timed out first
                self.server.abandoned += 1  # type: ignore[attr-defined]

        def log_message(self, *args: object) -> None:
            pass

    server = Pages(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def backfill(chunks: list[tuple[int, list[fleet.Node]]], found: dict[str, fleet.Template], start: float,
             end: float, work: Path, tsdb: Path, done: multiprocessing.Queue) -> None:
    """The history [start, end) of each chunk of nodes into Prometheus' data folder; a chunk's promtool runs while
    the next chunk is written. Puts the samples written on `done` at the end."""
    promtool, samples, running = require("promtool"), 0, None
    steps = [start + k * fleet.STEP for k in range(int((end - start) // fleet.STEP))]
    for first, nodes in chunks:
        pages = [fleet.page(n, found[n.engine], target_labels=True) for n in nodes]
        text = work / f"chunk-{first}.om"
        with open(text, "w", buffering=1 << 20) as out:
            for t in steps:  # time-major: each series' samples in order
                for p in pages:
                    lines = list(fleet.samples(p, t))
                    samples += len(lines)
                    out.writelines(lines)
            out.write("# EOF\n")
        if running is not None:
            _finish(*running, tsdb)
        blocks = work / f"blocks-{first}"
        running = (subprocess.Popen([promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(blocks)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), text, blocks)
    if running is not None:
        _finish(*running, tsdb)
    done.put(samples)


def _finish(proc: subprocess.Popen, text: Path, blocks: Path, tsdb: Path) -> None:
    """Waits for a chunk's promtool and moves its blocks into the live data folder."""
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"promtool on {text}: {err.decode()[-2000:]}")
    text.unlink()
    for block in blocks.iterdir():
        block.rename(tsdb / block.name)
    blocks.rmdir()


class Prometheus:
    def __init__(self, tmp: Path, targets: int, page_port: int) -> None:
        self.port = free_port()
        self.tsdb = tmp / "tsdb"
        sd = tmp / "targets.json"
        sd.write_text(json.dumps([{"targets": [f"127.0.0.1:{page_port}"],
                                   "labels": {"__metrics_path__": f"/node/{i}/metrics",
                                              "instance": f"node-{i:04d}:9847"}} for i in range(targets)]))
        config = tmp / "prometheus.yml"
        self.rules = sorted(str(p) for p in (ROOT / "rules").glob("*.yml"))
        config.write_text(yaml.safe_dump({
            # 14 s: the page server (Python, sharing the CPUs) is not what is measured; a slow page would make `up` 0.
            "global": {"scrape_interval": "15s", "scrape_timeout": "14s", "evaluation_interval": "15s"},
            "rule_files": self.rules,
            "scrape_configs": [
                {"job_name": "stallwatch", "file_sd_configs": [{"files": [str(sd)]}]},
                {"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{self.port}"]}]},
            ],
        }))
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [require("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.tsdb}",
                 "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=out, stderr=subprocess.STDOUT)
        poll(lambda: self.proc.poll() is None and self.get("/-/ready"), timeout=60, what="Prometheus")

    def get(self, path: str) -> dict | bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as response:
            return json.load(response) if path.startswith("/api/") else response.status == 200

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query?query=" + urllib.parse.quote(expr))["data"]["result"]  # type: ignore[index]

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def note(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--history-minutes", type=float, default=120.0)
    parser.add_argument("--live-minutes", type=float, default=12.0,
                        help="live evaluations before measuring: past the longest `for` (10m) and its windows")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="backfill writers at once, each with its promtool (default: half the CPUs)")
    parser.add_argument("--timeout-minutes", type=float, default=90.0, help="gives up (and cleans up) after this")
    parser.add_argument("--hold-minutes", type=float, default=0.0,
                        help="after the report, keeps the fleet and Prometheus running this long (its URL printed), "
                             "to try queries against it (`/api/v1/query?stats=all` says what each costs)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` cleans up too
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-fleet-"))
    stack: list = []
    try:
        run(args, tmp, stack)
    finally:
        for thing in reversed(stack):
            thing()
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path, stack: list) -> None:
    deadline = time.monotonic() + args.timeout_minutes * 60
    note("live scrapes of the exporter (SGLang and vLLM, TP=8, 8 GPUs with every health field)")
    found = fleet.templates()
    now = time.time()
    horizon = now + (args.live_minutes + args.timeout_minutes) * 60
    nodes = fleet.fleet(args.nodes, now, horizon)
    pages = [fleet.page(n, found[n.engine], target_labels=False) for n in nodes]
    server = serve_pages(pages)
    stack.append(server.shutdown)
    prometheus = Prometheus(tmp, args.nodes, server.server_address[1])
    stack.append(prometheus.stop)
    live_from = time.time()
    note(f"Prometheus scraping {args.nodes} nodes; backfilling {args.history_minutes:g} min of history")
    done: multiprocessing.Queue = multiprocessing.Queue()
    work = tmp / "backfill"
    work.mkdir()
    chunks = [(first, nodes[first:first + CHUNK]) for first in range(0, len(nodes), CHUNK)]
    jobs = max(1, min(args.jobs, len(chunks)))
    began = time.monotonic()
    writers = [multiprocessing.get_context("fork").Process(
        target=backfill, args=(chunks[k::jobs], found, now - args.history_minutes * 60, now, work, prometheus.tsdb,
                               done)) for k in range(jobs)]
    for writer in writers:
        writer.start()
        stack.append(lambda w=writer: w.is_alive() and (w.terminate(), w.join()))

    written: list[int] = []
    history: tuple[int, float] | None = None
    measure_at = live_from + args.live_minutes * 60
    while time.time() < measure_at or history is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {args.timeout_minutes:g} minutes")
        while not done.empty():
            written.append(done.get())
        if history is None and len(written) == jobs:
            history = (sum(written), time.monotonic() - began)
            note(f"history written: {history[0]:,} samples in {history[1]:.0f} s by {jobs} writer(s); measuring once "
                 "Prometheus has loaded it and the live window has run")
            measure_at = max(measure_at, time.time() + 90)  # its blocks are loaded within a minute
        if history is None and any(w.exitcode not in (None, 0) for w in writers):
            raise SystemExit("the backfill failed (see above)")
        time.sleep(5)
    report(args, prometheus, nodes, found, history, server.abandoned)
    if args.hold_minutes:
        note(f"holding Prometheus at http://127.0.0.1:{prometheus.port} for {args.hold_minutes:g} min")
        time.sleep(args.hold_minutes * 60)


def report(args: argparse.Namespace, prometheus: Prometheus, nodes: list[fleet.Node],
           found: dict[str, fleet.Template], history: tuple[int, float], abandoned: int) -> None:
    per_node = {e: len(t.series) for e, t in found.items()}
    print(f"fleet: {args.nodes} nodes x {fleet.GPUS} GPUs, "
          + ", ".join(f"{c} {s}" for s, c in sorted(Counter(n.state for n in nodes).items()))
          + f"; series per node from the live scrapes: SGLang {per_node['sglang']}, vLLM {per_node['vllm']}")
    gaps = fleet.catalog_gaps(found)
    print(f"catalog families no template has (not benched): {', '.join(gaps) or 'none'}")
    print(f"history: {args.history_minutes:g} min, {history[0]:,} samples, written and backfilled in "
          f"{history[1]:.0f} s")
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]  # type: ignore[index]
    print(f"rule groups, last {WINDOW} (prometheus_rule_group_last_duration_seconds, one sample per evaluation):")
    for group in groups:
        selector = f'{{rule_group="{group["file"]};{group["name"]}"}}'
        mean = prometheus.scalar(f"avg_over_time(prometheus_rule_group_last_duration_seconds{selector}[{WINDOW}])")
        worst = prometheus.scalar(f"max_over_time(prometheus_rule_group_last_duration_seconds{selector}[{WINDOW}])")
        missed = prometheus.scalar(f"sum(prometheus_rule_group_iterations_missed_total{selector})")
        costliest = [r for r in sorted(group["rules"], key=lambda r: -r["evaluationTime"])
                     if r["evaluationTime"] >= COSTLY]
        print(f"  {group['name']:<24} mean {mean * 1000:8.1f} ms  max {worst * 1000:8.1f} ms  "
              f"interval {group['interval']:g} s  missed {missed:g}; its rules of {COSTLY * 1000:g} ms or more now: "
              + (", ".join(f"{r['name']} {r['evaluationTime'] * 1000:.0f} ms" for r in costliest) or "none"))
    head = prometheus.scalar("prometheus_tsdb_head_series")
    scraped = prometheus.scalar('count({job="stallwatch"})')
    status = Path(f"/proc/{prometheus.proc.pid}/status").read_text()
    rss, hwm = (int(re.search(rf"{k}:\s+(\d+)", status).group(1)) * 1024 for k in ("VmRSS", "VmHWM"))  # type: ignore
    interval = prometheus.scalar('max(prometheus_target_interval_length_seconds{quantile="0.99"})')
    print(f"head series {head:,.0f}, of them {scraped:,.0f} of the nodes ({scraped / args.nodes:.0f} per node, "
          f"`up` and the scrape's own among them); Prometheus RSS {rss / 2**20:,.0f} MiB "
          f"(high water {hwm / 2**20:,.0f} MiB); scrape interval p99 {interval:.3f} s; pages whose scrape timed out "
          f"before they were written: {abandoned} (the generator too slow on this machine)")
    alerts(prometheus, nodes)


def alerts(prometheus: Prometheus, nodes: list[fleet.Node]) -> None:
    by_instance = {n.instance: n for n in nodes}
    found = prometheus.get("/api/v1/alerts")["data"]["alerts"]  # type: ignore[index]
    firing = {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in found if a["state"] == "firing"}
    pending = {(a["labels"]["alertname"], a["labels"].get("instance", "")) for a in found if a["state"] == "pending"}
    now = time.time()
    expected = {(name, n.instance) for n in nodes for name in n.expected(now)}
    waits = {r["name"]: r["duration"] for g in prometheus.get("/api/v1/rules")["data"]["groups"]  # type: ignore[index]
             for r in g["rules"] if r["type"] == "alerting"}

    def scrape_failed(name: str, instance: str) -> bool:
        """Whether the node's `up` was 0 within the alert's `for`, the idle window before it (the rules' 5-minute
        rates need the window full, `offset 5m`: a stale sample there holds them back as long) and an evaluation's
        slack."""
        window = int(waits.get(name, 0) + IDLE_WINDOW + 2 * fleet.STEP)
        return bool(prometheus.query(f'min_over_time(up{{job="stallwatch",instance="{instance}"}}[{window}s]) == 0'))

    false = firing - expected
    # Pending again, or not yet: a group that evaluates every minute may not have run since the series came back.
    restarted = {e for e in expected - firing if scrape_failed(*e)}
    missed = expected - firing - restarted
    print(f"alerts: {len(expected)} (alert, node) pairs expected, {len(firing)} firing, "
          f"{len(expected & firing)} of them expected")
    for name, count in sorted(Counter(name for name, _ in expected).items()):
        hit = sum(1 for e in expected & firing if e[0] == name)
        print(f"  {name:<40} {hit}/{count}")
    print(f"false alerts: {len(false)}" + "".join(
        f"\n  {name} on {inst} ({by_instance[inst].state if inst in by_instance else 'not a node'})"
        for name, inst in sorted(false)))
    print(f"missed alerts: {len(missed)}" + "".join(
        f"\n  {name} on {inst} ({by_instance[inst].state} {by_instance[inst].engine})"
        for name, inst in sorted(missed)))
    if restarted:
        print("held back again by a failed scrape within their `for` (the series went stale): " + ", ".join(
            f"{name} on {inst}" for name, inst in sorted(restarted)))
    others = Counter(name for name, _ in pending - expected)
    print("pending, not expected (held back by `for`): "
          + (", ".join(f"{k} {v}" for k, v in sorted(others.items())) or "none"))
    if false or missed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
