"""Soak: the real exporter against churning simulated servers and several scrapers, for `--minutes` (default 60),
printing its RSS, threads, open fds and series count every minute (audit 2026-12-02, "Soak"; issue 30 section 3).

On a node of its own (tests/support/cluster.py, root: its own PID namespace, so only these processes are seen). Two
long-lived servers (a serving SGLang that logs its stats line every 0.2 s, a serving vLLM) and, every
`--churn-seconds`, a new simulated SGLang on a new port while the previous one is killed (its process group): each is
a new server name, kept by discovery for `discovery.forget_after` after it is gone. The default `forget_after` (1 h)
unless `--forget-after` sets another for the run (a shorter run reaches the steady state sooner with a shorter one).
`--scrapers` clients each `GET /metrics` on a fresh connection once a second. It stops by itself after `--minutes`
and ends every process it started.

    .venv/bin/python tests/bench/bench_soak.py [--minutes 60] [--churn-seconds 20] [--scrapers 4] [--forget-after 5m]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support import transcripts
from support.cluster import Node
from support.harness import Engine, Exporter, Scrape

CONFIG = ("discovery: {{enabled: true, interval: 2s{forget}}}\nlogs: {{poll_interval: 1s}}\n"
          "defaults: {{probe: {{interval: 5s, timeout: 2s}}}}\nengine_metrics: {{interval: 5s, timeout: 2s}}\n"
          "web: {{show_evidence: true}}\n")
CHATTY = {"running": 2, "throughput": 40.0, "interval": 0.2, "metrics": "serve"}  # a stats line every 0.2 s


class Scrapers:
    """`count` threads, each scraping `url` on a fresh connection once a second until stopped: latencies and
    failures, read and reset once a minute."""

    def __init__(self, url: str, count: int) -> None:
        self.url, self._stop = url, threading.Event()
        self._lock = threading.Lock()
        self._seconds: list[float] = []
        self._failed = 0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as response:
                    response.read()
                ok = response.status == 200
            except OSError:
                ok = False
            with self._lock:
                self._seconds.append(time.perf_counter() - start)
                self._failed += not ok
            self._stop.wait(1.0)

    def take(self) -> tuple[list[float], int]:
        with self._lock:
            seconds, failed, self._seconds, self._failed = self._seconds, self._failed, [], 0
        return seconds, failed

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(35)


def figures(exporter: psutil.Process, scrape: Scrape) -> str:
    series = sum(len(f.samples) for f in scrape.families.values())
    servers = len({ls["server"] for ls in scrape.labelsets("stallwatch_server_info")})
    rss = exporter.memory_info().rss / 2**20
    return f"RSS {rss:6.1f} MiB  threads {exporter.num_threads():3d}  fds {exporter.num_fds():3d}  " \
           f"series {series:5d}  servers {servers:3d}"


def latency(seconds: list[float], failed: int) -> str:
    if len(seconds) < 2:
        return f"scrapes {len(seconds)}, failed {failed}"
    p99 = statistics.quantiles(seconds, n=100)[98]
    return (f"scrapes {len(seconds):4d}  p50 {statistics.median(seconds) * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms  "
            f"max {max(seconds) * 1000:6.1f} ms  failed {failed}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--churn-seconds", type=float, default=20.0)
    parser.add_argument("--scrapers", type=int, default=4)
    parser.add_argument("--forget-after", default="", help="discovery.forget_after for the run (default: the "
                                                           "exporter's own, 1 h)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    node = Node(tmp, "soak")
    engines: list[Engine] = []
    scrapers: Scrapers | None = None
    try:
        forget = f", forget_after: {args.forget_after}" if args.forget_after else ""
        e = Exporter(node.tmp, config=CONFIG.format(forget=forget), listen_host="0.0.0.0", prefix=node.prefix(),
                     url_host=node.address)
        exporter = next(p for p in node.processes() if "stallwatch" in " ".join(p.cmdline()))

        def start(kind: str, transcript: str, **extra: object) -> Engine:
            sim = Engine(node.tmp, kind, transcript, final="serve", tp=1, prefix=node.prefix(), **extra)
            engines.append(sim)
            return sim

        start("sglang", transcripts.sglang_healthy(tp=1), work=CHATTY)
        start("vllm", transcripts.vllm_healthy(tp=1))
        scrapers = Scrapers(f"{e.url}/metrics", args.scrapers)
        print(f"soak: {args.minutes:g} min, a new server every {args.churn_seconds:g} s, {args.scrapers} scrapers, "
              f"forget_after {args.forget_after or 'default (1h)'}", flush=True)
        began = time.monotonic()
        end = began + args.minutes * 60
        churn: Engine | None = None
        started = 0
        next_churn, next_print, minute = began, began, 0
        while (now := time.monotonic()) < end:
            if now >= next_churn:
                if churn is not None:
                    churn.stop()
                    engines.remove(churn)
                churn = start("sglang", transcripts.sglang_healthy(tp=1))
                started += 1
                next_churn += args.churn_seconds
            if now >= next_print:
                seconds, failed = scrapers.take()
                print(f"minute {minute:3d}  {figures(exporter, e.scrape())}  started {started:4d}  "
                      f"{latency(seconds, failed)}", flush=True)
                minute += 1
                next_print += 60
            wait(min(next_churn, next_print, end) - time.monotonic(), e.proc.poll)
        seconds, failed = scrapers.take()
        print(f"end         {figures(exporter, e.scrape())}  started {started:4d}  {latency(seconds, failed)}")
        log = e.log.read_text(errors="replace")
        print(f"exporter log: {len(log.splitlines())} lines, {log.count('Traceback')} tracebacks")
        e.stop()
    finally:
        if scrapers is not None:
            scrapers.stop()
        for sim in engines:
            sim.stop()
        node.close()


def wait(seconds: float, exited: Callable[[], int | None]) -> None:
    """Wait `seconds`, a second at a time, failing as soon as the exporter has exited."""
    deadline = time.monotonic() + max(0.0, seconds)
    while (left := deadline - time.monotonic()) > 0 and exited() is None:
        time.sleep(min(left, 1.0))
    if exited() is not None:
        raise RuntimeError(f"the exporter exited {exited()}")


if __name__ == "__main__":
    main()
