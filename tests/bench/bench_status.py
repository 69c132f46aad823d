"""Status page cost: latency of `/servers/<name>` for a stalled TP=8 SGLang (evidence off, and on: the py-spy
stacks are cached 30 s, so most views reuse them), `/metrics` latency while pages are viewed, the exporter's RSS,
the memory one full hour of history takes per server, and a hostile server's page (a Python process of 300 threads
900 frames deep): its time and size, the exporter's peak RSS, and another server's page viewed meanwhile.

    .venv/bin/python tests/bench/bench_status.py [--seconds 35] [--parts pages,ring,hostile]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallwatch.signals.history import SPAN_SECONDS, History
from stallwatch.web.routes import status_path
from support import transcripts
from support.harness import Engine, Exporter, free_port, gpus, poll
from support.load import latency_quantiles, timed_get
from support.looks import Looked, look, proc

CONFIG = "defaults:\n  stall:\n    log_stale: 1s\nweb:\n  history_interval: 1s\n  show_evidence: {evidence}\n"
# Threads that each sleep at the bottom of a deep recursion; the argv looks like an SGLang server's.
HOSTILE = """
import sys, threading, time
def deep(n):
    return time.sleep(3600) if n == 0 else deep(n - 1)
for _ in range(int(sys.argv[1])):
    threading.Thread(target=deep, args=(int(sys.argv[2]),), daemon=True).start()
deep(10)
"""


def pages(tmp: Path, seconds: float, evidence: bool) -> None:
    sim = Engine(tmp, "sglang", transcripts.sglang_until_shards(8, 64), final="stall")
    try:
        poll(lambda: sim.log.exists() and "64/64" in sim.log.read_text(), what="64/64")
        held = {"gpus": [dict(g, processes=[{"pid": sim.proc.pid, "used": 76e9}]) for g in gpus(8)]}
        e = Exporter(tmp, config=CONFIG.format(evidence=str(evidence).lower()), nvml=held)
        try:
            url = e.url + status_path(sim.name)
            poll(lambda: "verdict stalled" in e.get(status_path(sim.name))[1], timeout=20, what="the stalled verdict")
            page_times, scrape_times = [], []
            stop = threading.Event()

            def scrape() -> None:
                while not stop.is_set():
                    scrape_times.append(timed_get(e.url + "/metrics"))
                    time.sleep(0.05)

            scraper = threading.Thread(target=scrape)
            scraper.start()
            deadline = time.monotonic() + seconds  # past the 30 s stack cache: some views run py-spy
            while time.monotonic() < deadline:
                page_times.append(timed_get(url))
                time.sleep(0.1)
            stop.set()
            scraper.join()
            rss = psutil.Process(e.proc.pid).memory_info().rss / 2**20
            label = "evidence on " if evidence else "evidence off"
            print(f"{label}: {len(page_times)} views in {seconds:.0f} s: {latency_quantiles(page_times)}")
            print(f"              /metrics meanwhile: {latency_quantiles(scrape_times)} ({len(scrape_times)} scrapes); "
                  f"exporter RSS {rss:.1f} MiB")
        finally:
            e.stop()
    finally:
        sim.stop()


def ring_memory(servers: int, processes: int) -> None:
    """One hour of 10 s points for `servers` servers of `processes` processes each, held in memory."""
    fake = [Looked(look(f"ns/server-{s}", tree=[proc(1000 * s + p, 1.7e9 + p, cpu=1.5) for p in range(processes)]))
            for s in range(servers)]
    now = [0.0]
    history = History(SimpleNamespace(servers=lambda: fake), interval=10.0,  # type: ignore[arg-type]
                      wall=lambda: now[0])
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(int(SPAN_SECONDS / 10) + 1):
        history.sample_once()
        now[0] += 10.0
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"history: one hour for {servers} servers x {processes} processes: {used / 2**20:.1f} MiB "
          f"({used / servers / 1024:.0f} KiB per server)")


def hostile(tmp: Path, threads: int, frames: int) -> None:
    """The page of a server whose Python process has `threads` threads `frames` deep, and the page of another
    server requested a second later."""
    port = free_port()
    script = tmp / "hostile.py"
    script.write_text(HOSTILE)
    proc = subprocess.Popen([sys.executable, str(script), str(threads), str(frames), "-m", "sglang.launch_server",
                             "--port", str(port)])
    e = Exporter(tmp, config="discovery: {enabled: true, interval: 1s}\nweb:\n  show_evidence: true\nservers:\n"
                             "  - {engine: sglang, name: ordinary, match: {cmdline: no-such}}\n",
                 args=("--no-collector.gpu",))
    try:
        name = f"sglang-{port}"
        e.wait_for(lambda s: s.value("stallwatch_server_up", server=name) == 1, timeout=30, what="the hostile server")
        before = _rss(e.proc.pid)
        with ThreadPoolExecutor(2) as pool:
            start = time.perf_counter()
            page = pool.submit(e.get, status_path(name), 120)
            time.sleep(1.0)
            other = timed_get(e.url + status_path("ordinary"))
            size = len(page.result()[1].encode())
            seconds = time.perf_counter() - start
        print(f"hostile server ({threads} threads x {frames} frames): page {seconds:.1f} s, {size / 1e6:.2f} MB; "
              f"another server's page meanwhile {other * 1000:.0f} ms; exporter RSS {before:.0f} -> "
              f"{_rss(e.proc.pid):.0f} MiB, peak {_hwm(e.proc.pid):.0f} MiB")
    finally:
        e.stop()
        proc.kill()
        proc.wait()


def _rss(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def _hwm(pid: int) -> float:
    """The process's peak RSS so far (`VmHWM`), MiB."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=35.0)
    parser.add_argument("--parts", default="pages,ring,hostile")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "pages" in parts:
        for evidence in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                pages(Path(tmp), args.seconds, evidence)
    if "ring" in parts:
        ring_memory(servers=8, processes=17)
    if "hostile" in parts:
        for threads, frames in ((300, 900), (150, 200)):  # py-spy takes about 10 s, and about 1 s
            with tempfile.TemporaryDirectory() as tmp:
                hostile(Path(tmp), threads, frames)


if __name__ == "__main__":
    main()
