"""Log ingest speed and memory, side by side with Debian's mtail.

1. A 1,000,000-line SGLang decode log: lines/s of stallwatch's follower and phase-and-event matcher
   (all rules of the engine) against `mtail --one_shot` counting the same file's lines with one regex;
   then the same log as a Kubernetes container writes it (containerd's CRI format), both side by side.
2. RSS growth of a process ingesting a 1 GB log.
3. CPU of the running exporter following a log that grows at 10 MB/s.

    .venv/bin/python tests/bench/bench_logs.py [--lines 1000000] [--gigabytes 1] [--grow-seconds 20]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallwatch.discovery.workload import LogSource
from stallwatch.signals.logs import LogManager
from support import transcripts
from support.harness import Exporter
from support.watchers import log_watcher

MTAIL_PROGRAM = 'counter decode_lines\n/Decode batch, #running-req: (\\d+)/ {\n  decode_lines++\n}\n'


def write_log(path: Path, lines: int) -> int:
    with open(path, "w") as f:
        f.write(transcripts.sglang_healthy())
        for start in range(0, lines, 100_000):
            f.write("".join(transcripts.sglang_decode(min(100_000, lines - start), start)))
    return path.stat().st_size


def write_cri(plain: Path, path: Path) -> None:
    """`plain` as containerd writes a container's stdout: `<RFC3339Nano> stdout F <line>` per line."""
    with open(plain, "rb") as src, open(path, "wb") as out:
        for n, line in enumerate(src):
            out.write(b"2026-11-29T10:%02d:%02d.%09dZ stdout F " % (n // 60000 % 60, n // 1000 % 60, n) + line)


def ingest(path: Path, fmt: str = "plain", text_size: int | None = None) -> tuple[float, int, str]:
    """Follow `path` (in format `fmt`, whose engine text is `text_size` bytes) from its start to its end;
    seconds taken, lines counted, final phase."""
    target = Path(f"{path}.{time.monotonic_ns()}.link")
    watcher = log_watcher({"bench": [target]})
    server = watcher.servers()[0]
    server.launch = dataclasses.replace(server.launch, log_sources=(LogSource(str(target), str(target), fmt),))
    manager = LogManager(watcher, poll_interval=1.0)
    size = text_size if text_size is not None else path.stat().st_size
    manager.poll()
    os.symlink(path, target)  # appears after the follower started: read from its start, like a new log
    start = time.perf_counter()
    while True:
        manager.poll()
        stats = [s for s in manager.stats() if s.path == str(target)]
        if stats and stats[0].read_bytes >= size:
            break
    elapsed = time.perf_counter() - start
    return elapsed, stats[0].lines, watcher.servers()[0].interpreter.snapshot().phase


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--grow-seconds", type=float, default=20.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-logs-"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> None:
    log = tmp / "decode.log"
    size = write_log(log, args.lines)
    print(f"log: {args.lines} decode lines after a healthy SGLang startup, {size / 1e6:.0f} MB")

    ours_seconds, lines, phase = ingest(log)
    print(f"stallwatch: {ours_seconds:.2f} s, {lines / ours_seconds:,.0f} lines/s, "
          f"{size / ours_seconds / 1e6:.0f} MB/s (all SGLang phase/event rules; phase {phase})")

    mtail = shutil.which("mtail")
    assert mtail, "apt-get install mtail"
    progs = tmp / "progs"
    progs.mkdir()
    (progs / "decode.mtail").write_text(MTAIL_PROGRAM)
    start = time.perf_counter()
    out = subprocess.run([mtail, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(progs),
                          "--logs", str(log)], capture_output=True, text=True, check=True).stdout
    mtail_seconds = time.perf_counter() - start
    counted = [line for line in out.splitlines() if line.startswith("decode_lines")]
    print(f"mtail --one_shot: {mtail_seconds:.2f} s, {lines / mtail_seconds:,.0f} lines/s (one regex; "
          f"{counted[0] if counted else 'no count'})")
    print(f"ratio (stallwatch lines/s / mtail lines/s): {mtail_seconds / ours_seconds:.1f}  (target >= 3)")

    cri = tmp / "decode-cri.log"
    write_cri(log, cri)
    cri_seconds, cri_lines, cri_phase = ingest(cri, "cri", size)
    print(f"stallwatch, CRI format ({cri.stat().st_size / 1e6:.0f} MB): {cri_seconds:.2f} s, "
          f"{cri_lines / cri_seconds:,.0f} lines/s (phase {cri_phase})")
    start = time.perf_counter()
    subprocess.run([mtail, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(progs), "--logs", str(cri)],
                   capture_output=True, check=True)
    mtail_cri = time.perf_counter() - start
    print(f"mtail --one_shot, CRI format: {mtail_cri:.2f} s, {lines / mtail_cri:,.0f} lines/s")
    print(f"ratio, CRI format: {mtail_cri / cri_seconds:.1f}  (target >= 3)")
    cri.unlink()

    big = tmp / "big.log"
    with open(big, "wb") as f:
        chunk = log.read_bytes()
        while f.tell() < args.gigabytes * 1e9:
            f.write(chunk)
    rss = subprocess.run([sys.executable, "-c", RSS_CHILD, str(big)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))
    print(rss.stdout.strip())
    big.unlink()

    grow = tmp / "grow.log"
    grow.write_bytes(b"")
    exporter = Exporter(tmp, config=f"servers:\n  - name: grow\n    engine: sglang\n    match: {{cmdline: no-such}}\n"
                                     f"    logs: ['{grow}']\n    probes: []\n", args=("--no-collector.gpu",))
    try:
        proc = psutil.Process(exporter.proc.pid)
        block = log.read_bytes()[: 1 << 20]
        cpu_before, start = sum(proc.cpu_times()[:2]), time.monotonic()
        written = 0
        with open(grow, "ab") as f:
            while (elapsed := time.monotonic() - start) < args.grow_seconds:
                if written < elapsed * 10e6:
                    f.write(block)
                    f.flush()
                    written += len(block)
                else:
                    time.sleep(0.01)
        time.sleep(1.5)
        cpu = sum(proc.cpu_times()[:2]) - cpu_before
        wall = time.monotonic() - start
        read = exporter.scrape().value("stallwatch_log_read_bytes_total", server="grow", path=str(grow))
        print(f"exporter following a log growing at {written / args.grow_seconds / 1e6:.1f} MB/s: "
              f"{100 * cpu / wall:.1f}% of one core over {wall:.0f} s, {read / 1e6:.0f} MB read  (target <= 25%)")
    finally:
        exporter.stop()


RSS_CHILD = """
import sys, time, psutil
from pathlib import Path
sys.path.insert(0, "tests/bench")
from bench_logs import ingest
path = Path(sys.argv[1])
proc = psutil.Process()
before = proc.memory_info().rss
seconds, lines, phase = ingest(path)
after = proc.memory_info().rss
print(f"1 GB ingest: {path.stat().st_size / 1e9:.2f} GB in {seconds:.1f} s; RSS {before / 2**20:.1f} -> "
      f"{after / 2**20:.1f} MiB, growth {(after - before) / 2**20:.1f} MiB  (target <= 10 MiB)")
"""


if __name__ == "__main__":
    main()
