"""HTTP load and fault figures at full size (the CI form is tests/system/test_load.py, with the same scenarios).

The exporter watches a simulated SGLang TP=8 server with 8 fake GPUs, on loopback:
  1. 50 concurrent keep-alive scrapers for 60 s (each pausing 0.1 s between scrapes): errors, p50/p99/max;
  2. 1,000 idle connections and a 200-connection slowloris while one client scrapes: latency, thread count, and
     when the exporter cut them (header deadline 10 s);
  3. TLS scrapes beside 50 handshake-less connections and one half-sent ClientHello;
  4. RLIMIT_NOFILE lowered on the running exporter and exhausted: CPU while exhausted, recovery;
  5. 150 connections, each a request then 1 MiB of a head that never ends: RSS growth
     (docs/research/audit-2026-12-01.md #5);
  6. scrapes beside 8 connections that stream pipelined requests without pause
     (docs/research/audit-2026-12-01.md #4);
  7. authenticated scrapes beside 48 connections guessing the password of a cost-12 hash
     (docs/research/audit-2026-12-01.md #6);
  8. scrapes beside 16 connections that ask for `/metrics` 1,000 times and never read, and when the exporter reset
     them (write deadline 10 s); then beside 16 that ask 50 times and reconnect once reset, as the audit's
     `slowread` (docs/research/audit-2026-12-02.md #8);
  9. the first scrape of 5 scrapers whose password was never checked, beside 16 connections from their address
     guessing cost-12 passwords as one user and as random names (docs/research/audit-2026-12-02.md #9).
The attacking clients of 6-9 run in a child process, so that their threads do not slow the measuring client;
the regression tests of 5-7 are tests/unit/web/test_server.py, of 8 and 9 tests/system/test_web.py too.

    .venv/bin/python tests/bench/bench_http.py [--seconds 60] [--scrapers 50] [--idle 1000] [--slow 200]
        [--attack-seconds 15] [--slow-readers 16] [--cold-scrapers 5]
        [--only bigheads,pipelining,guessing,slowreaders,coldauth]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import secrets
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import bcrypt
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support.harness import Exporter, poll
from support.load import (
    Figures,
    Rig,
    Scraper,
    basic,
    concurrent_scrapers,
    cpu_percent,
    cut,
    idle_and_slowloris,
    past_fd_limit,
    raise_nofile,
    sequential_scrapes,
    slow_reader,
    slow_readers,
    start_rig,
    timed_scrapes,
    tls_beside_handshakeless,
    wait_ready,
    wrong_passwords,
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
    closed = [_closed(sock) for sock in socks]  # every socket drained on each call, not up to the first still open
    return time.monotonic() if all(closed) else None


def _closed(sock: socket.socket) -> bool:
    """Whether the exporter closed `sock`, its answers read."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


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


MIB = 1 << 20
BIG_HEAD = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * MIB
PIPELINED = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n" * 256


def big_heads(rig: Rig, args: argparse.Namespace) -> None:
    proc = psutil.Process(rig.exporter.proc.pid)
    rss = [proc.memory_info().rss]
    socks = [socket.create_connection(("127.0.0.1", rig.exporter.port), timeout=30) for _ in range(args.bigheads)]
    start = time.monotonic()
    senders = [threading.Thread(target=_send_quietly, args=(sock, BIG_HEAD), daemon=True) for sock in socks]
    for sender in senders:
        sender.start()

    def sampled_cut() -> float | None:
        rss.append(proc.memory_info().rss)
        return None if any(sender.is_alive() for sender in senders) else _all_closed(socks)

    cut = poll(sampled_cut, timeout=40, interval=0.05, what="connections cut")
    for sock in socks:
        sock.close()
    print(f"{args.bigheads} connections, each a request then 1 MiB of a head that never ends: exporter RSS "
          f"{rss[0] / MIB:.0f} MiB before, peak +{(max(rss) - rss[0]) / MIB:.1f} MiB, "
          f"+{(rss[-1] - rss[0]) / MIB:.1f} MiB once all were cut, {cut - start:.2f} s after the first byte  "
          "(target: far below 1 MiB a connection)")


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the exporter refuses the head and closes while it is sent
        sock.sendall(data)


@contextlib.contextmanager
def in_child(target: Callable[..., None], *args: object) -> Iterator[Synchronized]:
    """`target(*args, count)` in a forked process until the block ends; yields the count it keeps."""
    context = multiprocessing.get_context("fork")
    count = context.Value("q", 0)
    child = context.Process(target=target, args=(*args, count), daemon=True)
    child.start()
    try:
        yield count
    finally:
        child.terminate()
        child.join(10)


def _threads(connections: int, one: Callable[[], None]) -> None:
    threads = [threading.Thread(target=one, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _add(count: Synchronized, n: int) -> None:
    with count.get_lock():
        count.value += n


def pipelining_clients(port: int, connections: int, answered: Synchronized) -> None:
    """The `pipeline2.py` of docs/research/audit-2026-12-01.md #4: each connection writes 256 pipelined requests at
    a time without pause while a thread drains the answers (counted)."""
    def one() -> None:
        sock = socket.create_connection(("127.0.0.1", port))

        def drain() -> None:
            with contextlib.suppress(OSError):
                while chunk := sock.recv(MIB):
                    _add(answered, chunk.count(b"Healthy."))

        threading.Thread(target=drain, daemon=True).start()
        with contextlib.suppress(OSError):
            while True:
                sock.sendall(PIPELINED)

    _threads(connections, one)


def password_guessers(port: int, connections: int, answered: Synchronized) -> None:
    """The `bcryptflood.py` of docs/research/audit-2026-12-01.md #6: each keep-alive connection loops on `/metrics`
    with a random password."""
    def one() -> None:
        scraper = Scraper(port)
        while True:
            scraper.headers = f"Authorization: {basic('alice', secrets.token_hex(8))}\r\n"
            try:
                scraper.get()
                _add(answered, 1)
            except (OSError, ValueError, StopIteration):
                scraper.close()

    _threads(connections, one)


def scrapes_for(port: int, seconds: float, headers: str = "", pause: float = 0.1) -> Figures:
    """One keep-alive client scraping `/metrics` every `pause` for `seconds`."""
    stop = time.monotonic() + seconds
    return timed_scrapes(Scraper(port, headers=headers), lambda: time.monotonic() < stop, pause)


def pipelining(rig: Rig, args: argparse.Namespace) -> None:
    with in_child(pipelining_clients, rig.exporter.port, args.pipeliners) as answered:
        figures = scrapes_for(rig.exporter.port, args.attack_seconds)
        rate = answered.value / args.attack_seconds
    print(figures.line(f"scrapes beside {args.pipeliners} connections streaming pipelined requests, "
                       f"{args.attack_seconds:g} s") + f"; pipelined requests answered {rate:.0f}/s"
          "  (target: p99 well under the 10 s scrape timeout)")


def guessing(tmp: Path, args: argparse.Namespace) -> None:
    web = tmp / "web.yml"
    web.write_text(f"basic_auth_users: {{alice: '{bcrypt.hashpw(b'secret', bcrypt.gensalt(12)).decode()}'}}\n")
    exporter = Exporter(tmp, args=(f"--web.config.file={web}",), ready=False)
    good = f"Authorization: {basic('alice', 'secret')}\r\n"
    try:
        poll(lambda: scrapes_for(exporter.port, 0.01, good).latencies, timeout=30, what="exporter, alice cached")
        with in_child(password_guessers, exporter.port, args.guessers) as answered:
            figures = scrapes_for(exporter.port, args.attack_seconds, good)
            rate = answered.value / args.attack_seconds
    finally:
        exporter.stop()
    print(figures.line(f"scrapes with cached credentials beside {args.guessers} connections guessing a cost-12 "
                       f"password, {args.attack_seconds:g} s") + f"; guesses answered {rate:.0f}/s"
          "  (target: p99 close to an unattacked scrape)")


def slow_reading(rig: Rig, args: argparse.Namespace) -> None:
    with slow_readers(rig.exporter.port, args.slow_readers, requests=1000) as socks:
        start = time.monotonic()
        figures = sequential_scrapes(rig.exporter.port, 200, pause=0.02)
        print(figures.line(f"scrapes beside {args.slow_readers} connections that never read")
              + "  (target: 0 errors, p99 close to an unattacked scrape)")
        done = poll(lambda: all(cut(sock) for sock in socks) and time.monotonic(), timeout=60, interval=0.2,
                    what="slow readers reset")
        print(f"  all {len(socks)} reset by the exporter {done - start:.1f} s after the scrapes began "
              "(write deadline 10 s)")
    size = len(Scraper(rig.exporter.port).get()[1])
    print("  " + scrapes_for(rig.exporter.port, 5).line(f"unattacked scrapes of {size / 1000:.0f} kB, 5 s"))
    with in_child(reconnecting_slow_readers, rig.exporter.port, args.slow_readers, 2 * SEND_BUFFER // size) as again:
        figures = scrapes_for(rig.exporter.port, args.attack_seconds)
        print("  " + figures.line(f"beside {args.slow_readers} readers that never read, each reconnecting once "
                                  f"reset (the audit's slowread), {args.attack_seconds:g} s")
              + f"; {again.value} reconnects  (audit 2026-12-02 #8 before the fix: p50 7.9 s, p99 11.2 s)")


SEND_BUFFER = 4 << 20  # the most the kernel's send buffer of a connection takes by default (tcp_wmem)


def reconnecting_slow_readers(port: int, count: int, requests: int, reconnects: Synchronized) -> None:
    """docs/research/audit-2026-12-02.md #8's `slowread`: `count` connections with a 1 KiB receive buffer, each
    sending pipelined `GET /metrics` and never reading, each opened again once the exporter cuts it. The audit asked
    50 times for 88 kB; `requests` is chosen so that the answers overflow the kernel's send buffer as there."""
    socks = [slow_reader(port, requests) for _ in range(count)]
    while True:
        for i, sock in enumerate(socks):
            if cut(sock):
                sock.close()
                with contextlib.suppress(OSError):
                    socks[i] = slow_reader(port, requests)
                    _add(reconnects, 1)
        time.sleep(0.2)


def flooding_passwords(port: int, clients: int, answered: Synchronized) -> None:
    with wrong_passwords(port, "alice", clients) as statuses:
        while True:
            time.sleep(0.2)
            answered.value = sum(statuses.values())


def cold_scrapers(tmp: Path, args: argparse.Namespace) -> None:
    """Scrapers whose password was never checked (after a restart, all of them), beside 16 connections from their
    own address guessing cost-12 passwords as alice and as random user names (docs/research/audit-2026-12-02.md #9):
    each cold scraper's first scrape, and the cached scraper's scrapes meanwhile."""
    cold = [f"bob{i}" for i in range(args.cold_scrapers)]
    web = tmp / "web.yml"
    hashes = {name: bcrypt.hashpw(b"secret", bcrypt.gensalt(12)).decode() for name in ["alice", *cold]}
    web.write_text("basic_auth_users:\n" + "".join(f"  {name}: '{digest}'\n" for name, digest in hashes.items()))
    exporter = Exporter(tmp, args=(f"--web.config.file={web}",), ready=False)
    good = f"Authorization: {basic('alice', 'secret')}\r\n"
    try:
        poll(lambda: scrapes_for(exporter.port, 0.01, good).latencies, timeout=30, what="exporter, alice cached")
        with in_child(flooding_passwords, exporter.port, 16) as answered:
            start = time.monotonic()
            poll(lambda: answered.value > 100, timeout=30, what="the flood under way")
            firsts = Figures()
            for name in cold:
                took = _first_scrape(exporter.port, name)
                (firsts.errors.append(name) if took is None else firsts.latencies.append(took))
            cached = scrapes_for(exporter.port, 5, good)
            rate = answered.value / (time.monotonic() - start)
    finally:
        exporter.stop()
    print(firsts.line(f"{len(cold)} cold scrapers' first scrapes beside 16 connections guessing cost-12 passwords "
                      "from their address") + f"; guesses answered {rate:.0f}/s  (before the fix: 429 throughout)")
    print("  " + cached.line("cached scraper meanwhile"))


def _first_scrape(port: int, user: str, give_up: float = 60.0) -> float | None:
    """Seconds until `user` is let in, trying again a second after each 429 (as Retry-After says; Prometheus would
    wait for its next scrape); None if not within `give_up`."""
    scraper = Scraper(port, headers=f"Authorization: {basic(user, 'secret')}\r\n")
    began = time.perf_counter()
    try:
        while time.perf_counter() - began < give_up:
            try:
                if scraper.get()[0] == 200:
                    return time.perf_counter() - began
            except OSError as exc:  # no answer within the client's 10 s: counted in the time, tried again
                print(f"  {user}: {exc!r} after {time.perf_counter() - began:.1f} s")
                scraper.close()
            time.sleep(1)
        return None
    finally:
        scraper.close()


RIG_SCENARIOS = {"scrapers": scrapers, "flood": flood, "emfile": lambda rig, _: emfile(rig), "bigheads": big_heads,
                 "pipelining": pipelining, "slowreaders": slow_reading}
OWN_EXPORTER = {"tls": lambda tmp, _: tls(tmp), "guessing": guessing, "coldauth": cold_scrapers}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--attack-seconds", type=float, default=15.0)
    parser.add_argument("--bigheads", type=int, default=150)
    parser.add_argument("--pipeliners", type=int, default=8)
    parser.add_argument("--guessers", type=int, default=48)
    parser.add_argument("--slow-readers", type=int, default=16)
    parser.add_argument("--cold-scrapers", type=int, default=5)
    parser.add_argument("--only", default=",".join([*RIG_SCENARIOS, *OWN_EXPORTER]), help="scenarios, comma-separated")
    args = parser.parse_args()
    chosen = args.only.split(",")
    raise_nofile(8192)
    tmp = Path(tempfile.mkdtemp(prefix="stallwatch-bench-http-"))
    print(f"cores: {psutil.cpu_count()}, load average {psutil.getloadavg()[0]:.1f}")
    if any(name in chosen for name in RIG_SCENARIOS):  # the simulated TP=8 server takes a while to start
        rig = start_rig(tmp)
        try:
            wait_ready(rig)
            for name in (n for n in RIG_SCENARIOS if n in chosen):
                RIG_SCENARIOS[name](rig, args)
        finally:
            rig.exporter.stop()
            rig.engine.stop()
    for name in (n for n in OWN_EXPORTER if n in chosen):
        (tmp / name).mkdir()
        OWN_EXPORTER[name](tmp / name, args)


if __name__ == "__main__":
    main()
