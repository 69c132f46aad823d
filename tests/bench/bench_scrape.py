"""Scrape latency, memory and CPU of the exporter, side by side with Debian's prometheus-process-exporter.

Setup: 8 fake GPUs (tests/support/fakes/pynvml.py), one simulated SGLang server of 17 processes (main, 14
schedulers, detokenizer, resource tracker) and 2 probes. Both exporters watch the same tree and are scraped alternately.

    .venv/bin/python tests/bench/bench_scrape.py [--scrapes 1000] [--idle-seconds 60]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support import transcripts
from support.harness import Engine, Exporter, free_port, gpus, poll


def fetch(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        response.read()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=1000)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-"))
    sim = Engine(tmp, "sglang", transcripts.sglang_until_shards(tp=14, shards=64), final="serve", tp=14)
    try:
        run(args, tmp, sim)
    finally:
        sim.stop()


def run(args: argparse.Namespace, tmp: Path, sim: Engine) -> None:
    tree = poll(lambda: (p := psutil.Process(sim.proc.pid)) and len(p.children(recursive=True)) == 16 and p,
                timeout=60, what="17 processes")
    pids = [tree.pid] + [c.pid for c in tree.children(recursive=True)]
    nvml = gpus(8)
    for i, gpu in enumerate(nvml):
        gpu["processes"] = [{"pid": pids[1 + i], "used": 75e9}]
    config = (f"servers:\n  - name: bench\n    engine: sglang\n    match: {{cmdline: 'launch_server.*{sim.port}'}}\n"
              f"    probes:\n      - {{url: 'http://127.0.0.1:{sim.port}/health'}}\n"
              f"      - {{url: 'http://127.0.0.1:{sim.port}/v1/models'}}\n")
    ours = Exporter(tmp, config=config, nvml={"gpus": nvml})
    ours.wait_for(lambda s: len(s.samples("stallwatch_server_gpu_memory_used_bytes")) == 8
                  and s.probe("stallwatch_probe_success", server="bench", url=f"http://127.0.0.1:{sim.port}/health"))

    binary = shutil.which("prometheus-process-exporter")
    assert binary, "apt-get install prometheus-process-exporter"
    pe_config = tmp / "process-exporter.yml"
    pe_config.write_text("process_names:\n  - name: sglang\n    cmdline: ['sglang\\.launch_server']\n")
    pe_port = free_port()
    # smaps off: the stricter baseline (its default reads every smaps file and is slower).
    theirs = subprocess.Popen([binary, f"-config.path={pe_config}", f"-web.listen-address=127.0.0.1:{pe_port}",
                               "-gather-smaps=false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pe_url = f"http://127.0.0.1:{pe_port}/metrics"
    poll(lambda: b'groupname="sglang"' in urllib.request.urlopen(pe_url, timeout=5).read(), what="process-exporter")
    text = urllib.request.urlopen(pe_url).read().decode()
    procs = [line for line in text.splitlines()
             if line.startswith('namedprocess_namegroup_num_procs{groupname="sglang"')]
    try:
        ours_url = ours.url + "/metrics"
        proc = psutil.Process(ours.proc.pid)
        for _ in range(20):  # warm up both
            fetch(ours_url), fetch(pe_url)
        rss_start = proc.memory_info().rss
        ours_times, theirs_times, rss_at = [], [], {}
        for i in range(1, args.scrapes + 1):
            ours_times.append(fetch(ours_url))
            theirs_times.append(fetch(pe_url))
            if i in (100, args.scrapes // 2, args.scrapes):
                rss_at[i] = proc.memory_info().rss

        def p(values: list[float], q: float) -> float:
            return statistics.quantiles(values, n=100)[int(q) - 1] * 1000

        print(f"process tree: {len(pids)} processes; process-exporter sees {procs[0].split()[-1]}")
        print(f"scrapes: {args.scrapes} of each, alternating")
        print(f"stallwatch            p50 {p(ours_times, 50):6.2f} ms  p90 {p(ours_times, 90):6.2f} ms")
        print(f"process-exporter      p50 {p(theirs_times, 50):6.2f} ms  p90 {p(theirs_times, 90):6.2f} ms")
        print(f"ratio of p50 (ours / process-exporter): {p(ours_times, 50) / p(theirs_times, 50):.2f}  (target <= 0.5)")
        print(f"stallwatch RSS: {rss_start / 2**20:.1f} MiB after warm-up, "
              + ", ".join(f"{v / 2**20:.1f} MiB after {k}" for k, v in rss_at.items()) + "  (target <= 60 MiB)")

        cpu_before, wall_before = sum(proc.cpu_times()[:2]), time.monotonic()
        while time.monotonic() - wall_before < args.idle_seconds:
            fetch(ours_url)
            time.sleep(15)
        cpu = sum(proc.cpu_times()[:2]) - cpu_before
        wall = time.monotonic() - wall_before
        print(f"stallwatch CPU scraped every 15 s: {100 * cpu / wall:.2f}% of one core over {wall:.0f} s "
              "(target <= 1%)")
    finally:
        theirs.terminate()
        ours.stop()


if __name__ == "__main__":
    main()
