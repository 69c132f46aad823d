"""Scrape latency and threads of the exporter while one user runs many sleeping processes with an engine's argv
(docs/research/audit-2026-12-01.md #3: 200 of them took `/metrics` from 1.4 ms to 20 s and threads from 16 to 416).

On a node of its own (tests/support/cluster.py, root: its own PID namespace, so only these processes are seen),
with the default caps (`discovery.max_servers` 64, `max_servers_per_user` 32) unless `--config` says otherwise.

    .venv/bin/python tests/bench/bench_discovery.py [--processes 200] [--seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support.cluster import Node
from support.harness import NOBODY, Exporter, poll

SLEEPER = ["/usr/bin/python3", "-c", "import time; time.sleep(600)", "-m", "sglang.launch_server", "--enable-metrics",
           "--port"]
CONFIG = ("discovery: {enabled: true, interval: 1s}\ndefaults: {probe: {interval: 2s, timeout: 1s}}\n"
          "engine_metrics: {interval: 2s, timeout: 2s}\nlogs: {poll_interval: 0.5s}\n")


def scrape_seconds(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--config", default="", help="more config lines (e.g. a discovery: line with other caps)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-discovery-"))
    node = Node(tmp, "bench")
    try:
        e = Exporter(node.tmp, config=CONFIG + args.config, listen_host="0.0.0.0", prefix=node.prefix(),
                     url_host=node.address)
        exporter = next(p for p in node.processes() if "stallwatch" in " ".join(p.cmdline()))
        url = f"{e.url}/metrics"
        rest = [scrape_seconds(url) for _ in range(20)]
        idle_threads = exporter.num_threads()
        for i in range(args.processes):
            subprocess.Popen([*node.prefix(), *NOBODY, *SLEEPER, str(40000 + i)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        poll(lambda: sum("sglang.launch_server" in " ".join(p.cmdline()) for p in node.processes())
             >= args.processes, timeout=60, what="the processes")
        deadline, under = time.monotonic() + args.seconds, []
        while time.monotonic() < deadline:
            under.append(scrape_seconds(url))
            time.sleep(0.5)
        scrape = e.scrape()
        watched = sum(1 for s in scrape.samples("stallwatch_server_up"))
        skipped = scrape.value("stallwatch_discovery_skipped_processes")
        quantiles = statistics.quantiles(under, n=100)
        print(f"{args.processes} sleeping processes of one user, {args.seconds:g} s, {len(under)} scrapes:")
        print(f"  watched servers {watched}, skipped {skipped:.0f}; exporter threads {idle_threads} at rest, "
              f"{exporter.num_threads()} under them; RSS {psutil.Process(exporter.pid).memory_info().rss >> 20} MiB")
        print(f"  /metrics at rest: median {statistics.median(rest) * 1000:.1f} ms")
        print(f"  /metrics under them: median {statistics.median(under) * 1000:.1f} ms, p99 {quantiles[98] * 1000:.1f} "
              f"ms, max {max(under) * 1000:.1f} ms")
        e.stop()
    finally:
        node.close()


if __name__ == "__main__":
    main()
