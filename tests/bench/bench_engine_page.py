"""The cost of an engine `/metrics` page bomb: 4 MiB of tiny series (about 95,000 samples of one family, as the
fake vLLM of docs/research/audit-2026-12-01.md #9 served it), fetched over loopback from a separate process.

1. RSS of this process while four fetch loops (one per fake engine, as the exporter runs them) read the bomb at
   once, ten rounds each: before and its peak (`VmHWM`).
2. One fetch and read: seconds and the peak of Python's allocations (tracemalloc), stallwatch's reading against
   prometheus_client's full parser of the same page (how it was read before).

    .venv/bin/python tests/bench/bench_engine_page.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from stallwatch.engines import ENGINES
from stallwatch.signals.engine_page import MAX_BODY_BYTES, parse_page
from stallwatch.signals.probes import fetch
from support.harness import free_port, poll

SPEC = ENGINES["vllm"].metrics
assert SPEC is not None


def bomb() -> bytes:
    """At most MAX_BODY_BYTES: the two small families, then as many one-sample series as fit."""
    head = f"{SPEC.waiting} 0\n{SPEC.tokens} 5\n# TYPE {SPEC.running} gauge\n".encode()
    lines, size, i = [head], len(head), 0
    while size + len(line := f'{SPEC.running}{{engine="{i}"}} 1\n'.encode()) <= MAX_BODY_BYTES:
        lines.append(line)
        size += len(line)
        i += 1
    return b"".join(lines)


def read_once(url: str) -> str:
    """One fetch and read, as the engine page loop makes them: what it concludes."""
    result, body = fetch(url, 10.0, MAX_BODY_BYTES)
    assert result.success and body is not None, result
    try:
        return str(parse_page(body, SPEC))
    except ValueError as exc:
        return f"failed fetch: {exc}"


def full_parser(url: str) -> str:
    """The same page through prometheus_client's parser, every sample kept."""
    _, body = fetch(url, 10.0, MAX_BODY_BYTES)
    assert body is not None
    samples = sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))
    return f"{samples} samples"


def measured(read: Callable[[str], str], url: str) -> str:
    tracemalloc.start()
    start = time.perf_counter()
    outcome = read(url)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return f"{seconds:.2f} s, peak {peak / 2**20:.1f} MiB allocated ({outcome})"


def memory(kind: str) -> float:
    """This process's `VmRSS` or `VmHWM`, MiB."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(kind + ":"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        page = bomb()
        (Path(tmp) / "metrics").write_bytes(page)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", tmp,
                                   str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            poll(lambda: fetch(url, 2.0, MAX_BODY_BYTES)[0].success, what="the page server")
            lines = page.count(b"\n")
            print(f"page: {len(page):,} bytes, {lines:,} lines")
            before = memory("VmRSS")
            with ThreadPoolExecutor(4) as pool:
                outcomes = set(pool.map(read_once, [url] * 4 * args.rounds))
            print(f"4 fetch loops x {args.rounds} rounds: RSS {before:.0f} MiB, peak {memory('VmHWM'):.0f} MiB "
                  f"({'; '.join(outcomes)})")
            print(f"one fetch, stallwatch: {measured(read_once, url)}")
            print(f"one fetch, prometheus_client's parser: {measured(full_parser, url)}")
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
