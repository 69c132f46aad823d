"""HTTP load and fault figures at full size (the CI form is tests/test_load.py, with the same scenarios).

The exporter watches a simulated SGLang TP=8 server with 8 fake GPUs, on loopback:
  1. 50 concurrent keep-alive scrapers for 60 s (each pausing 0.1 s between scrapes): errors, p50/p99/max;
  2. 1,000 idle connections and a 200-connection slowloris while one client scrapes: latency, thread count, and
     when the exporter cut them (header deadline 10 s);
  3. TLS scrapes beside 50 handshake-less connections and one half-sent ClientHello;
  4. RLIMIT_NOFILE lowered on the running exporter and exhausted: CPU while exhausted, recovery.

    .venv/bin/python tests/bench/bench_http.py [--seconds 60] [--scrapers 50] [--idle 1000] [--slow 200]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support.harness import poll
from support.load import (
    Rig,
    concurrent_scrapers,
    cpu_percent,
    idle_and_slowloris,
    past_fd_limit,
    raise_nofile,
    sequential_scrapes,
    start_rig,
    tls_beside_handshakeless,
    wait_ready,
)


def scrapers(rig: Rig, args: argparse.Namespace) -> None:
    proc = psutil.Process(rig.exporter.proc.pid)
    cpu_before, wall = sum(proc.cpu_times()[:2]), time.monotonic()
    figures = concurrent_scrapers(rig.exporter.port, args.scrapers, args.seconds, pause=0.1)
    cpu = 100 * (sum(proc.cpu_times()[:2]) - cpu_before) / (time.monotonic() - wall)
    print(figures.line(f"{args.scrapers} concurrent scrapers, {args.seconds:g} s")
          + f"; exporter CPU {cpu:.0f}% of a core, {proc.num_threads()} threads  (target: 0 errors, p99 <= 100 ms)")


def flood(rig: Rig, args: argparse.Namespace) -> None:
    proc = psutil.Process(rig.exporter.proc.pid)
    threads_before = proc.num_threads()
    start = time.monotonic()
    with idle_and_slowloris(rig.exporter.port, args.idle, args.slow) as socks:
        opened = time.monotonic() - start
        threads_during = proc.num_threads()
        figures = sequential_scrapes(rig.exporter.port, 200, pause=0.02)
        print(figures.line(f"scrapes beside {args.idle} idle + {args.slow} slowloris connections (opened in "
                           f"{opened:.1f} s)") + f"; exporter threads {threads_before} -> {threads_during}, "
              f"{proc.num_fds()} fds  (target: <= 50 ms, threads bounded)")
        cut = poll(lambda: _all_closed(socks), timeout=30, interval=0.2, what="connections cut")
        print(f"  all {len(socks)} cut by the exporter {cut - start:.1f} s after the first was opened "
              "(header deadline 10 s from accept)")


def _all_closed(socks: list[socket.socket]) -> float | None:
    for sock in socks:
        sock.setblocking(False)
        try:
            if sock.recv(65536) != b"":
                return None
        except BlockingIOError:
            return None
        except OSError:
            pass
    return time.monotonic()


def tls(tmp: Path) -> None:
    figures = tls_beside_handshakeless(tmp, silent=50, scrapers=10, seconds=10, pause=0.1)
    print(figures.line("TLS: 10 scrapers for 10 s beside 50 handshake-less + 1 half ClientHello"))


def emfile(rig: Rig) -> None:
    with past_fd_limit(rig, 500) as limit:
        during = sequential_scrapes(rig.exporter.port, 5, pause=0.2)
        cpu = cpu_percent(rig.exporter.proc.pid, 5.0)
    start = time.monotonic()
    poll(lambda: sequential_scrapes(rig.exporter.port, 1).latencies, timeout=30, what="recovery")
    print(f"EMFILE: 500 connections at a limit of {limit} descriptors: exporter CPU {cpu:.1f}% of a core over 5 s; "
          f"scrapes during: {len(during.latencies)} ok, {len(during.errors)} failed; after closing them a scrape "
          f"answered within {1000 * (time.monotonic() - start):.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=200)
    args = parser.parse_args()
    raise_nofile(8192)
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-http-"))
    rig = start_rig(tmp)
    try:
        wait_ready(rig)
        print(f"cores: {psutil.cpu_count()}; exporter pid {rig.exporter.proc.pid}")
        scrapers(rig, args)
        flood(rig, args)
        emfile(rig)
    finally:
        rig.exporter.stop()
        rig.engine.stop()
    tls_tmp = tmp / "tls"
    tls_tmp.mkdir()
    tls(tls_tmp)


if __name__ == "__main__":
    main()
