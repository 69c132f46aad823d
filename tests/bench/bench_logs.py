"""Log ingest speed and memory, side by side with Debian's mtail, and what a hostile log costs the others.

1. A 1,000,000-line SGLang decode log: lines/s of stallwatch's follower and phase-and-event matcher
   (all rules of the engine) against `mtail --one_shot` counting the same file's lines with one regex;
   then the same log as a Kubernetes container writes it (containerd's CRI format), both side by side;
   then the running exporter catching up on the same lines appended at once (`live`).
2. RSS growth of a process ingesting a 1 GB log.
3. CPU of the running exporter following a log that grows at 10 MB/s.
4. Matching speed of the interpreter on blocks of notable lines (tracebacks, heartbeats, long lines) (`matching`).
5. How late a real server's new line is seen behind a 64 MiB file of tracebacks that 5 servers' processes share,
   and behind a process writing tracebacks as fast as it can (`lag`).

    .venv/bin/python tests/bench/bench_logs.py [--lines 1000000] [--gigabytes 1] [--grow-seconds 20]
        [--parts mtail,cri,live,rss,grow,matching,lag] [--lag-seconds 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.source import LogSource
from stallwatch.signals.logs import LogManager
from support import transcripts
from support.harness import Exporter
from support.watchers import log_watcher

MTAIL_PROGRAM = 'counter decode_lines\n/Decode batch, #running-req: (\\d+)/ {\n  decode_lines++\n}\n'
PARTS = ("mtail", "cri", "live", "rss", "grow", "matching", "lag")
TRACEBACK = b"Traceback (most recent call last)\n"
SPEWER = """
import sys
block = b"Traceback (most recent call last)\\n" * 30000
with open(sys.argv[1], "ab", buffering=0) as f:
    while True:
        f.write(block)
"""


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
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which to run, of {', '.join(PARTS)}")
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    args = parser.parse_args()
    args.parts = set(args.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-logs-"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args: argparse.Namespace, tmp: Path) -> None:
    if "matching" in args.parts:
        matching()
    if "lag" in args.parts:
        lag(tmp, args.lag_seconds)
    if not args.parts & {"mtail", "cri", "live", "rss", "grow"}:
        return
    log = tmp / "decode.log"
    size = write_log(log, args.lines)
    print(f"log: {args.lines} decode lines after a healthy SGLang startup, {size / 1e6:.0f} MB")
    if args.parts & {"mtail", "cri", "live"}:
        mtail_seconds = baseline(tmp, log, size, args)
        if "live" in args.parts:
            live(tmp, log, mtail_seconds)
    if "rss" in args.parts:
        rss(log, args.gigabytes, tmp)
    if "grow" in args.parts:
        grow(log, args.grow_seconds, tmp)


def mtail_run(tmp: Path, log: Path) -> tuple[float, str]:
    """Seconds `mtail --one_shot` takes to count the decode lines of `log`, and its count."""
    mtail = shutil.which("mtail")
    assert mtail, "apt-get install mtail"
    progs = tmp / "progs"
    progs.mkdir(exist_ok=True)
    (progs / "decode.mtail").write_text(MTAIL_PROGRAM)
    start = time.perf_counter()
    out = subprocess.run([mtail, "--one_shot", "--one_shot_format", "prometheus", "--progs", str(progs),
                          "--logs", str(log)], capture_output=True, text=True, check=True).stdout
    counted = [line for line in out.splitlines() if line.startswith("decode_lines")]
    return time.perf_counter() - start, counted[0] if counted else "no count"


def baseline(tmp: Path, log: Path, size: int, args: argparse.Namespace) -> float:
    """stallwatch in process against mtail, plain and CRI; mtail's seconds on the plain log."""
    ours_seconds, lines, phase = ingest(log)
    print(f"stallwatch: {ours_seconds:.2f} s, {lines / ours_seconds:,.0f} lines/s, "
          f"{size / ours_seconds / 1e6:.0f} MB/s (all SGLang phase/event rules; phase {phase})")
    mtail_seconds, counted = mtail_run(tmp, log)
    print(f"mtail --one_shot: {mtail_seconds:.2f} s, {lines / mtail_seconds:,.0f} lines/s (one regex; {counted})")
    print(f"ratio (stallwatch lines/s / mtail lines/s): {mtail_seconds / ours_seconds:.1f}  (target >= 3)")
    if "cri" in args.parts:
        cri(tmp, log, size, lines)
    return mtail_seconds


def cri(tmp: Path, log: Path, size: int, lines: int) -> None:
    framed = tmp / "decode-cri.log"
    write_cri(log, framed)
    cri_seconds, cri_lines, cri_phase = ingest(framed, "cri", size)
    print(f"stallwatch, CRI format ({framed.stat().st_size / 1e6:.0f} MB): {cri_seconds:.2f} s, "
          f"{cri_lines / cri_seconds:,.0f} lines/s (phase {cri_phase})")
    mtail_cri, _ = mtail_run(tmp, framed)
    print(f"mtail --one_shot, CRI format: {mtail_cri:.2f} s, {lines / mtail_cri:,.0f} lines/s")
    print(f"ratio, CRI format: {mtail_cri / cri_seconds:.1f}  (target >= 3)")
    framed.unlink()


def follower(tmp: Path, name: str, path: Path) -> Exporter:
    """The exporter following `path` as the log of one configured server, `name`."""
    return Exporter(tmp, config=f"servers:\n  - name: {name}\n    engine: sglang\n    match: {{cmdline: no-such}}\n"
                                f"    logs: ['{path}']\n    probes: []\n", args=("--no-collector.gpu",))


def live(tmp: Path, log: Path, mtail_seconds: float) -> None:
    """The running exporter catching up on the whole decode log appended to a followed file at once."""
    target = tmp / "live.log"
    target.write_bytes(b"")
    exporter = follower(tmp, "live", target)
    try:
        size = log.stat().st_size
        exporter.wait_for(lambda s: s.log("stallwatch_log_up", server="live", path=str(target)) == 1)
        start = time.perf_counter()
        shutil.copyfile(log, target)  # the same inode: appended to, as a server writes
        exporter.wait_for(lambda s: (s.log("stallwatch_log_read_bytes_total", server="live", path=str(target))
                                     or 0) >= size, timeout=600, what="the whole log read")
        seconds = time.perf_counter() - start
    finally:
        exporter.stop()
    print(f"running exporter catching up on it appended at once: {seconds:.2f} s, {size / seconds / 1e6:.0f} MB/s; "
          f"ratio to mtail --one_shot {mtail_seconds / seconds:.1f}  (target >= 5)")


def rss(log: Path, gigabytes: float, tmp: Path) -> None:
    big = tmp / "big.log"
    with open(big, "wb") as f:
        chunk = log.read_bytes()
        while f.tell() < gigabytes * 1e9:
            f.write(chunk)
    child = subprocess.run([sys.executable, "-c", RSS_CHILD, str(big)], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent)))
    print(child.stdout.strip())
    big.unlink()


def grow(log: Path, grow_seconds: float, tmp: Path) -> None:
    grow = tmp / "grow.log"
    grow.write_bytes(b"")
    exporter = follower(tmp, "grow", grow)
    try:
        proc = psutil.Process(exporter.proc.pid)
        block = log.read_bytes()[: 1 << 20]
        cpu_before, start = sum(proc.cpu_times()[:2]), time.monotonic()
        written = 0
        with open(grow, "ab") as f:
            while (elapsed := time.monotonic() - start) < grow_seconds:
                if written < elapsed * 10e6:
                    f.write(block)
                    f.flush()
                    written += len(block)
                else:
                    time.sleep(0.01)
        time.sleep(1.5)
        cpu = sum(proc.cpu_times()[:2]) - cpu_before
        wall = time.monotonic() - start
        read = exporter.scrape().log("stallwatch_log_read_bytes_total", server="grow", path=str(grow))
        print(f"exporter following a log growing at {written / grow_seconds / 1e6:.1f} MB/s: "
              f"{100 * cpu / wall:.1f}% of one core over {wall:.0f} s, {read / 1e6:.0f} MB read  (target <= 25%)")
    finally:
        exporter.stop()


def matching() -> None:
    """MB/s of the interpreter's `feed` (SGLang's rules, before serving: every rule counts) per kind of block."""
    beats = transcripts.tgi_shard_stuck(1200).split("rank=1\n", 2)[2].encode()
    long_line = b"[2026-11-20 09:14:13 TP0] Load weight begin. avail mem=78.54 GB" + b" x" * 2000 + b"\n"
    blocks = [
        ("plain decode lines, 1 MiB blocks", "sglang", _fill("".join(transcripts.sglang_decode(20000)).encode())),
        ("tracebacks, 1 MiB blocks", "sglang", _fill(TRACEBACK)),
        ("tracebacks, 16 KiB blocks", "sglang", _fill(TRACEBACK, 16 << 10)),
        ("TGI heartbeats, 1 MiB blocks", "tgi", _fill(beats)),
        ("4 KiB lines with a rule's literal, 1 MiB blocks", "sglang", _fill(long_line)),
    ]
    print("interpreter on notable lines (MB/s of LogInterpreter.feed):")
    for label, engine, block in blocks:
        interpreter = LogInterpreter(ENGINES[engine])
        fed, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < 1.0:
            interpreter.feed(block)
            fed += len(block)
        print(f"  {label}: {fed / elapsed / 1e6:.1f} MB/s")


def _fill(lines: bytes, size: int = 1 << 20) -> bytes:
    """Whole copies of `lines` up to about `size` bytes."""
    return lines * max(1, size // len(lines)) if len(lines) < size else lines[: lines.rfind(b"\n", 0, size) + 1]


def lag(tmp: Path, seconds: float) -> None:
    """How late a real server's lines are seen: behind a 64 MiB file of tracebacks that 5 servers' processes
    share (replayed at start), then behind a process writing tracebacks to it as fast as it can."""
    shared, real = tmp / "shared.log", tmp / "real.log"
    shared.write_bytes(TRACEBACK * ((64 << 20) // len(TRACEBACK)))
    real.write_bytes(b"")
    watcher = log_watcher({**{f"hostile-{i}": [shared] for i in range(5)}, "real": [real]})
    seen: dict[int, float] = {}
    real_server = next(s for s in watcher.servers() if s.name == "real")
    real_server.interpreter.tap = lambda block: seen.update(
        (int(n), time.monotonic()) for n in re.findall(rb"real line (\d+)", block))
    manager = LogManager(watcher, poll_interval=0.5)
    manager.start()
    try:
        print(f"lag of a real server's line behind a 64 MiB traceback file of 5 servers: {_lags(real, seen, seconds)}")
        spewer = subprocess.Popen([sys.executable, "-c", SPEWER, str(shared)])
        try:
            print(f"  ... and behind a process writing tracebacks as fast as it can: {_lags(real, seen, seconds)}"
                  f" ({shared.stat().st_size / 2**20:.0f} MiB written)")
        finally:
            spewer.kill()
            spewer.wait()
        manager.check()  # raises when the follower has not finished a pass for `stale_after`
    finally:
        manager.stop()
        shared.unlink()


def _lags(real: Path, seen: dict[int, float], seconds: float) -> str:
    """Write a line to `real` every 0.25 s for `seconds`; how late each was seen (`seen`: number -> when)."""
    written: dict[int, float] = {}
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        number = max([*written, *seen, 0]) + 1
        with open(real, "ab") as f:
            f.write(b"real line %d\n" % number)
        written[number] = time.monotonic()
        time.sleep(0.25)
    deadline = time.monotonic() + 60
    while not all(n in seen for n in written) and time.monotonic() < deadline:
        time.sleep(0.05)
    lags = [seen[n] - at for n, at in written.items() if n in seen]
    missing = len(written) - len(lags)
    return (f"p50 {statistics.median(lags) * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms over {len(lags)} lines"
            + (f", {missing} not seen within 60 s" if missing else ""))


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
