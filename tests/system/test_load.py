"""Load and faults for the HTTP server, reduced for CI; `tests/bench/bench_http.py` runs the full figures."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from support.harness import poll
from support.load import (
    Rig,
    concurrent_scrapers,
    cpu_percent,
    cut,
    idle_and_slowloris,
    past_fd_limit,
    raise_nofile,
    sequential_scrapes,
    slow_readers,
    start_rig,
    tls_beside_handshakeless,
    wait_ready,
)

# The speed targets (p99 <= 100 ms for 50 scrapers, <= 50 ms beside idle and slowloris connections) are figures
# that tests/bench/bench_http.py prints at full size; no test asserts them, since a busy machine moves them. What
# these runs catch is a server that stalls (an accept loop or a worker held by a client): each scrape gives up
# after 10 s without an answer, and counts as an error. They print their figures too.


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    raise_nofile(4096)
    rig = start_rig(tmp_path_factory.mktemp("load"))
    try:
        wait_ready(rig)
        yield rig
    finally:
        rig.exporter.stop()
        rig.engine.stop()


def test_concurrent_scrapers(rig: Rig) -> None:
    # Each pausing 0.5 s: 100 scrapes a second, 50x a 2 s scrape interval; bench_http.py runs 5x this rate.
    figures = concurrent_scrapers(rig.exporter.port, scrapers=50, seconds=10, pause=0.5)
    print("\n" + figures.line("50 concurrent scrapers, 10 s"))
    assert figures.latencies and not figures.errors, figures.errors[:5]


def test_idle_connections_and_slowloris_do_not_slow_scrapes(rig: Rig) -> None:
    proc = psutil.Process(rig.exporter.proc.pid)
    threads_before = proc.num_threads()
    with idle_and_slowloris(rig.exporter.port, idle=300, slow=60):
        threads_during = proc.num_threads()
        figures = sequential_scrapes(rig.exporter.port, 100)
    print("\n" + figures.line("scrapes beside 300 idle + 60 slowloris connections")
          + f"; exporter threads {threads_before} -> {threads_during}")
    assert len(figures.latencies) == 100 and not figures.errors, figures.errors[:5]
    assert threads_during <= threads_before + 2  # nothing per connection


def test_readers_that_never_read_do_not_stall_scrapes(rig: Rig) -> None:
    """16 connections asking for `/metrics` 50 times each and never reading held every HTTP worker in a blocking
    send for the 10 s write timeout, so scrapes took 8-20 s (docs/research/audit-2026-12-02.md #8). Here each asks
    1,000 times, more answers than the kernel's send buffer takes (4 MiB at most by default): 20 scrapes beside them
    are all answered (each gives up after 10 s), and the exporter resets the 16 at their write deadline."""
    with slow_readers(rig.exporter.port, 16, requests=1000) as socks:
        start = time.monotonic()
        figures = sequential_scrapes(rig.exporter.port, 20)
        print("\n" + figures.line("scrapes beside 16 connections that never read"))
        assert len(figures.latencies) == 20 and not figures.errors, figures.errors[:5]
        poll(lambda: all(cut(sock) for sock in socks), timeout=60, interval=0.5, what="the 16 readers cut")
        print(f"  all 16 cut {time.monotonic() - start:.1f} s after the scrapes began (write deadline 10 s)")


@pytest.mark.process
def test_tls_handshakeless_clients_do_not_stall_scrapes(tmp_path: Path) -> None:
    figures = tls_beside_handshakeless(tmp_path, silent=20, scrapers=4, seconds=3, pause=0.05)
    print("\n" + figures.line("TLS scrapes beside 20 handshake-less + 1 half ClientHello"))
    assert figures.latencies and not figures.errors, figures.errors[:5]


def test_fd_exhaustion_backs_off_and_recovers(rig: Rig) -> None:
    """RLIMIT_NOFILE lowered on the running exporter, connections opened past it: accept meets EMFILE. The loop
    must not spin, and scrapes must work again once the connections go."""
    with past_fd_limit(rig, 150) as limit:
        cpu = cpu_percent(rig.exporter.proc.pid, 3.0)
    recovered = poll(lambda: sequential_scrapes(rig.exporter.port, 1).latencies, timeout=15,
                     what="scrapes after EMFILE")
    print(f"\nEMFILE: 150 connections over a limit of {limit} descriptors: exporter CPU {cpu:.1f}% of a core; "
          f"first scrape after {recovered[0] * 1000:.1f} ms")
    assert cpu < 30, f"accept loop spinning: {cpu:.1f}% CPU"
    assert "backing off" in rig.exporter.log.read_text()
    rig.exporter.wait_for(lambda s: all(v.value == 1 for v in s.samples("stallwatch_collector_success")),
                          what="collectors healthy again")
