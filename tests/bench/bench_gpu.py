"""NVML off the scrape path: the cost of the per-GPU readers and event threads on 8 GPUs, and the scrape and the Xid
events while one GPU's calls block.

Setup: 8 fake GPUs (tests/support/fakes/pynvml.py) with every health field, no inference server. First the
readers and the event threads in this process, each thread's CPU from its own clock; then the idle
exporter's CPU and threads (the NVML survey, one reader per GPU reading its memory, utilization and health fields
every `gpu.sample_interval`, and one thread per GPU waiting on its NVML events a second at a time), and `/metrics`
latency; then GPU 3's calls block for 45 s each (an Xid 119 GSP RPC timeout, NVIDIA/open-gpu-kernel-modules#446):
the same latency while it blocks, and how soon its Xid 119 and another GPU's Xid 79 right after are counted.

    .venv/bin/python tests/bench/bench_gpu.py [--scrapes 300] [--idle-seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support.harness import Exporter, FakeNvml, Scrape, gpus
from support.load import latency_quantiles, timed_get
from support.paths import FAKES

BLOCK_SECONDS = 45.0


def per_thread_cpu(tmp: Path, nvml: list[dict], seconds: float) -> None:
    """The same readers and event thread in this process, each thread's CPU from its own clock."""
    assert "pynvml" not in sys.modules, "the fake must be first on the path before pynvml is imported"
    FakeNvml(tmp / "in-process.json", {"gpus": nvml})
    os.environ["STALLWATCH_FAKE_NVML"] = str(tmp / "in-process.json")
    sys.path.insert(0, str(FAKES))
    from stallwatch.signals.nvml import Nvml
    from stallwatch.signals.xid import XidEvents

    readers = Nvml(1.0, 5.0)
    events = XidEvents(readers)
    readers.start()
    events.start()
    try:
        readers.settle(10.0)
        deadline = time.monotonic() + 10.0  # the event threads start once their GPU has answered
        while time.monotonic() < deadline and sum(t.name.startswith("NVML events GPU")
                                                   for t in threading.enumerate()) < len(nvml):
            time.sleep(0.05)
        clocks = {t.name: time.pthread_getcpuclockid(t.ident) for t in threading.enumerate()
                  if t.name.startswith("NVML") and t.ident is not None}
        before = {name: time.clock_gettime(clock) for name, clock in clocks.items()}
        time.sleep(seconds)
        used = {name: 100 * (time.clock_gettime(clock) - before[name]) / seconds for name, clock in clocks.items()}
    finally:
        events.stop()
        readers.stop()
    gpu = [share for name, share in used.items() if name.startswith("NVML GPU")]
    listening = [share for name, share in used.items() if name.startswith("NVML events GPU")]
    print(f"per thread, {seconds:g} s: NVML events {used['NVML events']:.3f}% of one core, NVML survey "
          f"{used['NVML survey']:.3f}%, each of the {len(gpu)} GPU readers {statistics.mean(gpu):.3f}% on average "
          f"(max {max(gpu):.3f}%), each of the {len(listening)} GPU event threads "
          f"{statistics.mean(listening):.3f}% (max {max(listening):.3f}%)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-gpu-"))
    nvml = gpus(8, util=40, power=310, power_limit=700, energy=1e6, recovery_action=0, ecc_uncorrected=0,
                remapped_rows=[0, 0, 0, 0], pcie_replays=0, clock_reasons=0)
    exporter = Exporter(tmp, nvml={"gpus": nvml}, config="gpu: {sample_interval: 1s, timeout: 5s}\n")
    per_thread_cpu(tmp, nvml, args.idle_seconds)
    try:
        exporter.wait_for(lambda s: len(s.samples("stallwatch_gpu_busy_seconds_total")) == 8, timeout=30)
        url, proc = exporter.url + "/metrics", psutil.Process(exporter.proc.pid)
        cpu_before, wall_before = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(args.idle_seconds)
        cpu = sum(proc.cpu_times()[:2]) - cpu_before
        share = 100 * cpu / (time.monotonic() - wall_before)
        print(f"idle exporter with 8 GPUs read every 1 s, health fields and events: {share:.2f}% of one core, "
              f"{proc.num_threads()} threads")
        print(f"/metrics, every GPU answering:  {latency_quantiles([timed_get(url) for _ in range(args.scrapes)])}")
        nvml[3]["block"] = BLOCK_SECONDS
        exporter.nvml.update(gpus=nvml)
        blocked = time.monotonic()
        exporter.wait_for(lambda s: s.value("stallwatch_gpu_up", gpu="3") == 0, timeout=30)
        print(f"GPU 3 read down {time.monotonic() - blocked:.1f} s after its calls began to block "
              "(gpu.timeout 5 s, sample_interval 1 s)")
        times = [timed_get(url) for _ in range(args.scrapes)]
        scrape = exporter.scrape()
        up = sorted(s.labels["gpu"] for s in scrape.samples("stallwatch_gpu_up") if s.value == 1)
        print(f"/metrics, GPU 3 blocking {BLOCK_SECONDS:g} s a call: {latency_quantiles(times)}; "
              f"GPUs up: {', '.join(up)}")
        exporter.nvml.update(events=[{"id": 1, "gpu": 3, "data": 119}, {"id": 2, "gpu": 4, "data": 79}])
        posted = time.monotonic()
        seen: dict[str, float] = {}

        def counted(s: Scrape) -> bool:
            for gpu, xid in (("3", "119"), ("4", "79")):
                uuid = nvml[int(gpu)]["uuid"]
                if gpu not in seen and s.value("stallwatch_gpu_xid_errors_total", gpu=gpu, uuid=uuid, xid=xid):
                    seen[gpu] = time.monotonic() - posted
            return len(seen) == 2

        exporter.wait_for(counted, timeout=90)
        print(f"Xid 119 of the blocked GPU 3 counted under its gpu and uuid {seen['3']:.1f} s after it was posted, "
              f"GPU 4's Xid 79 right after it {seen['4']:.1f} s (scraped every 0.2 s)")
    finally:
        exporter.stop()


if __name__ == "__main__":
    main()
