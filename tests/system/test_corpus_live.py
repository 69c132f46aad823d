"""The corpus of real logs replayed live: one exporter watches one configured server per log, each a sleeping
process of its own; the log's lines are appended over a few seconds after the exporter found it, the process is
killed where the log ends with it, and what the exporter exports is compared with the expert's reading
(`tests/fixtures/logs/readings.yml`). Prints one row per log; every row must match."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from support.corpus import READINGS, Seen, replay, writes
from support.harness import Exporter, Scrape

TOKEN = "stallwatch-corpus-replay"
# A worker node's place, on its command line (SGLang `--nnodes 2 --node-rank 1`): read with the worker rules.
WORKER_ARGS = ("--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000")


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health() -> Iterator[str]:
    """A /health that answers: the probe of an excerpt that begins while its server serves."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()


def _name(i: int) -> str:
    return f"log{i:03d}"


def _config(tmp: Path, health: str) -> str:
    out = ["discovery: {enabled: false, interval: 0.5s}", "logs: {poll_interval: 0.2s}", "servers:"]
    for i, r in enumerate(READINGS):
        probes = f"[{{url: '{health}', interval: 0.5s, timeout: 1s}}]" if r.serving_before else "[]"
        out.append(f"  - {{name: {_name(i)}, engine: {r.engine}, match: {{cmdline: '{TOKEN}-{i:03d}\\b'}}, "
                   f"logs: ['{tmp / _name(i)}.log'], probes: {probes}}}")
    return "\n".join(out) + "\n"


def _seen(scrape: Scrape, name: str) -> Seen:
    phase = next((ls["phase"] for ls in scrape.labelsets("stallwatch_startup_phase")
                  if ls["server"] == name and scrape.value("stallwatch_startup_phase", **ls) == 1), "")
    expected = scrape.value("stallwatch_weight_shards_expected", server=name)
    shards = None if expected is None else (int(scrape.value("stallwatch_weight_shards_loaded", server=name) or 0),
                                            int(expected))
    counts = tuple(sorted((ls["event"], int(scrape.value("stallwatch_log_events_total", **ls) or 0))
                          for ls in scrape.labelsets("stallwatch_log_events_total")
                          if ls["server"] == name and (scrape.value("stallwatch_log_events_total", **ls) or 0) > 0))
    return Seen(phase, shards, frozenset(event for event, _ in counts), counts)


def _append_over(paths: list[tuple[Path, bytes]], seconds: float) -> None:
    """Each log's lines, appended in ten parts spread over `seconds`, as a server writes them."""
    for part in range(10):
        for path, data in paths:
            lines = writes(data)
            step = -(-len(lines) // 10)
            with path.open("ab") as f:
                f.write(b"".join(lines[part * step:(part + 1) * step]))
        time.sleep(seconds / 10)


# Burns a CPU for at most a minute: a machine at a load average of several per core.
HOG = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"


@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "busy"])
def test_every_real_log_read_live_as_the_expert_reads_it(tmp_path: Path, health: str, busy: bool) -> None:
    """`busy`: beside three CPU hogs per core, each log written in one burst (its follower far behind): every event
    is counted as often as a quiet replay counts it, whatever the load (issue 26 class 5: at a load of 10-14, 12 of
    29 logs had no event counted)."""
    e = Exporter(tmp_path, config=_config(tmp_path, health))
    sleepers: list[subprocess.Popen[bytes]] = []
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for i, _ in enumerate(READINGS):
            (tmp_path / f"{_name(i)}.log").write_bytes(b"")
        for i, r in enumerate(READINGS):  # started after the exporter: what they write is news
            argv = [sys.executable, "-c", "import time; time.sleep(600)", f"{TOKEN}-{i:03d}",
                    *(WORKER_ARGS if r.worker else ())]
            sleepers.append(subprocess.Popen(argv))
        names = [_name(i) for i in range(len(READINGS))]
        e.wait_for(lambda s: all(s.value("stallwatch_server_up", server=n) == 1 for n in names), timeout=30,
                   what="every server's process found")
        before = [n for n, r in zip(names, READINGS, strict=True) if r.serving_before]
        e.wait_for(lambda s: all(_seen(s, n).phase == "serving" for n in before), timeout=30,
                   what="the excerpts' servers serving before their lines")
        logs = [(tmp_path / f"{n}.log", r.path.read_bytes()) for n, r in zip(names, READINGS, strict=True)]
        if busy:
            hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3 * (os.cpu_count() or 1))]
        _append_over(logs, seconds=0.0 if busy else 3.0)
        # Every byte read live (the files were empty when the followers opened them): then the process goes.
        e.wait_for(lambda s: all(s.log("stallwatch_log_read_bytes_total", server=n, path=str(p)) == len(data)
                                 for n, (p, data) in zip(names, logs, strict=True)), timeout=30,
                   what="every log read to its end")
        for proc, r in zip(sleepers, READINGS, strict=True):
            if not r.alive:
                proc.kill()

        def settled(s: Scrape) -> Scrape | None:
            return s if all(_seen(s, n).matches(r) for n, r in zip(names, READINGS, strict=True)) else None

        try:
            scrape = e.wait_for(settled, timeout=20, what="every log read as the expert reads it")
        except AssertionError:  # the table below says which
            scrape = e.scrape()
        rows = [(r, _seen(scrape, n)) for n, r in zip(names, READINGS, strict=True)]
        for r, seen in rows:
            print(f"\n{r.row(seen)}", end="")
        assert [r.file for r, seen in rows if not seen.matches(r)] == []
        assert [r.file for r, seen in rows if seen.counts != replay(r).counts] == []
    finally:
        for proc in [*hogs, *sleepers]:
            proc.kill()
            proc.wait()
        e.stop()
