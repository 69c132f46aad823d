"""The HTTP load and fault scenarios, shared by the reduced suite (`tests/system/test_load.py`) and the full-size
benchmark (`tests/bench/bench_http.py`): keep-alive scrapers, idle and slowloris connections, readers that never
read, handshake-less TLS clients, and descriptor exhaustion, against an exporter watching a simulated SGLang TP=8
server with 8 fake GPUs.
Every scenario is bounded in count and time and closes what it opened."""

from __future__ import annotations

import base64
import collections
import contextlib
import resource
import secrets
import socket
import ssl
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from support import transcripts
from support.certs import make_ca, make_cert
from support.harness import Engine, Exporter, gpus, poll


class Scraper:
    def __init__(self, port: int, path: str = "/metrics", context: ssl.SSLContext | None = None,
                 headers: str = "", timeout: float = 10.0) -> None:
        self.port, self.path, self.context, self.headers, self.timeout = port, path, context, headers, timeout
        self.sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        if self.context is not None:
            sock = self.context.wrap_socket(sock, server_hostname="127.0.0.1")
        return sock

    def get(self) -> tuple[int, bytes]:
        if self.sock is None:
            self.sock = self._connect()
        self.sock.sendall(f"GET {self.path} HTTP/1.1\r\nHost: x\r\n{self.headers}\r\n".encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the response head")
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        while len(body) < length:
            chunk = self.sock.recv(max(65536, length - len(body)))
            if not chunk:
                raise ConnectionError("closed mid-body")
            body += chunk
        if "connection: close" in head.decode("latin-1").lower():
            self.close()
        return int(lines[0].split()[1]), body

    def timed(self) -> float:
        start = time.perf_counter()
        status, body = self.get()
        if status != 200 or (self.path == "/metrics" and b"stallwatch_build_info" not in body):
            raise AssertionError(f"scrape answered {status}")
        return time.perf_counter() - start

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


@dataclass
class Figures:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def q(self, quantile: float) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] * 1000 if self.latencies else float("nan")
        return statistics.quantiles(self.latencies, n=1000, method="inclusive")[int(quantile * 1000) - 1] * 1000

    def line(self, label: str) -> str:
        return (f"{label}: {len(self.latencies)} scrapes, {len(self.errors)} errors, p50 {self.q(0.5):.1f} ms, "
                f"p99 {self.q(0.99):.1f} ms, max {max(self.latencies, default=0) * 1000:.1f} ms")


def concurrent_scrapers(port: int, scrapers: int, seconds: float, pause: float = 0.0,
                        context: ssl.SSLContext | None = None) -> Figures:
    """`scrapers` keep-alive clients scraping back to back (after `pause`) for `seconds`."""
    figures = Figures()
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run() -> None:
        scraper = Scraper(port, context=context)
        while time.monotonic() < stop:
            try:
                latency = scraper.timed()
                with lock:
                    figures.latencies.append(latency)
            except (OSError, AssertionError, ValueError, StopIteration) as exc:
                scraper.close()
                with lock:
                    figures.errors.append(repr(exc))
            time.sleep(pause)
        scraper.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(scrapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return figures


def timed_scrapes(scraper: Scraper, more: Callable[[], bool], pause: float) -> Figures:
    """Scrapes by one keep-alive client every `pause` while `more()`; an error closes its connection (the next
    scrape opens another) and counts."""
    figures = Figures()
    while more():
        try:
            figures.latencies.append(scraper.timed())
        except (OSError, AssertionError, ValueError, StopIteration) as exc:
            scraper.close()
            figures.errors.append(repr(exc))
        time.sleep(pause)
    scraper.close()
    return figures


def sequential_scrapes(port: int, count: int, context: ssl.SSLContext | None = None, pause: float = 0.02,
                       timeout: float = 10.0) -> Figures:
    """`count` scrapes by one keep-alive client; each read gives up after `timeout`."""
    left = iter(range(count))
    return timed_scrapes(Scraper(port, context=context, timeout=timeout), lambda: next(left, None) is not None, pause)


@contextlib.contextmanager
def idle_and_slowloris(port: int, idle: int, slow: int, trickle: float = 0.5) -> Iterator[list[socket.socket]]:
    """`idle` connections that send nothing and `slow` ones that trickle header lines, for as long as the block
    runs. Yields every socket (a closed one is one the exporter cut)."""
    socks: list[socket.socket] = []
    stop = threading.Event()
    try:
        for i in range(idle + slow):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks.append(sock)
            if i >= idle:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")

        def trickle_loop() -> None:
            while not stop.wait(trickle):
                for sock in socks[idle:]:
                    with contextlib.suppress(OSError):
                        sock.send(b"X-A: b\r\n")

        thread = threading.Thread(target=trickle_loop, daemon=True)
        thread.start()
        yield socks
    finally:
        stop.set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def slow_readers(port: int, count: int, requests: int = 50) -> Iterator[list[socket.socket]]:
    """`count` connections with a 1 KiB receive buffer, each sending `requests` pipelined `GET /metrics` and never
    reading, for as long as the block runs (docs/research/audit-2026-12-02.md #8's `slowread`). Yields every socket
    (`cut` tells, without reading, whether the exporter closed it)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(slow_reader(port, requests))
        yield socks
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@contextlib.contextmanager
def wrong_passwords(port: int, user: str, clients: int) -> Iterator[collections.Counter[tuple[str, int]]]:
    """`clients` keep-alive connections guessing passwords as fast as they are answered, for as long as the block
    runs (docs/research/audit-2026-12-02.md #9's flood): half as `user`, half with a random user name each time.
    Yields the count of answers by the name guessed as (`user`, or "random") and status."""
    statuses: collections.Counter[tuple[str, int]] = collections.Counter()
    lock, stop = threading.Lock(), threading.Event()

    def guess(kind: str, name: Callable[[], str]) -> None:
        scraper = Scraper(port)
        while not stop.is_set():
            scraper.headers = f"Authorization: {basic(name(), secrets.token_hex(8))}\r\n"
            try:
                answer = scraper.get()[0]
            except (OSError, ValueError, StopIteration):
                scraper.close()
                continue
            with lock:
                statuses[kind, answer] += 1
        scraper.close()

    names = ((user, lambda: user), ("random", lambda: secrets.token_hex(4)))
    threads = [threading.Thread(target=guess, args=names[i % 2], daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)


def slow_reader(port: int, requests: int) -> socket.socket:
    """One connection with a 1 KiB receive buffer that has sent `requests` pipelined `GET /metrics` and never reads."""
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * requests)
    except OSError:
        sock.close()
        raise
    return sock


def cut(sock: socket.socket) -> bool:
    """Whether the peer closed or reset a TCP connection, by its state (`tcp_info.tcpi_state`), without reading."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED


TCP_ESTABLISHED = 1


def timed_get(url: str, timeout: float = 120.0) -> float:
    """Seconds one GET of `url` takes, its body read."""
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        response.read()
    return time.perf_counter() - start


def latency_quantiles(samples: list[float]) -> str:
    cut = statistics.quantiles(samples, n=100, method="inclusive")  # never above the largest sample
    return f"p50 {cut[49] * 1000:.2f} ms, p99 {cut[98] * 1000:.2f} ms, max {max(samples) * 1000:.2f} ms"


def cpu_percent(pid: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    before = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return 100 * (sum(proc.cpu_times()[:2]) - before) / seconds


def raise_nofile(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard) if hard != resource.RLIM_INFINITY
                                                    else wanted, hard))


@dataclass
class Rig:
    exporter: Exporter
    engine: Engine
    tmp: Path


def start_rig(tmp: Path, args: tuple[str, ...] = ()) -> Rig:
    engine = Engine(tmp, "sglang", transcripts.sglang_until_shards(tp=8, shards=64), final="serve", tp=8)
    try:
        tree = poll(lambda: (p := psutil.Process(engine.proc.pid)) and len(p.children(recursive=True)) >= 8 and p,
                    timeout=60, what="TP=8 process tree")
        children = [c.pid for c in tree.children(recursive=True)]
        nvml = gpus(8)
        for i, gpu in enumerate(nvml):
            gpu["processes"] = [{"pid": children[i % len(children)], "used": 75e9}]
        config = (f"servers:\n  - name: tp8\n    engine: sglang\n"
                  f"    match: {{cmdline: 'launch_server.*{engine.port}'}}\n"
                  f"    probes:\n      - {{url: 'http://127.0.0.1:{engine.port}/health', interval: 1s}}\n")
        exporter = Exporter(tmp, config=config, nvml={"gpus": nvml}, args=args, ready=not args)
    except BaseException:
        engine.stop()
        raise
    return Rig(exporter, engine, tmp)


def wait_ready(rig: Rig) -> None:
    rig.exporter.wait_for(lambda s: len(s.samples("stallwatch_server_gpu_memory_used_bytes")) == 8,
                          timeout=60, what="TP=8 server watched")


def tls_beside_handshakeless(tmp: Path, silent: int, scrapers: int, seconds: float, pause: float) -> Figures:
    """Scrapes over TLS while `silent` clients connect and never start a handshake and one sends half a
    ClientHello: the handshake runs in a worker with a deadline, never in the accept loop."""

    ca = make_ca(tmp, "ca")
    cert = make_cert(tmp, "server", ca)
    web = tmp / "web.yml"
    web.write_text(f"tls_server_config: {{cert_file: {cert[0]}, key_file: {cert[1]}}}\n")
    exporter = Exporter(tmp, args=(f"--web.config.file={web}",), ready=False)
    context = ssl.create_default_context(cafile=str(ca[0]))
    try:
        poll(lambda: sequential_scrapes(exporter.port, 1, context).latencies, timeout=30, what="TLS exporter")
        idle = [socket.create_connection(("127.0.0.1", exporter.port)) for _ in range(silent)]
        half = socket.create_connection(("127.0.0.1", exporter.port))
        half.sendall(b"\x16\x03\x01\x00\xf0\x01\x00\x00\xec\x03\x03")  # a ClientHello cut short
        try:
            return concurrent_scrapers(exporter.port, scrapers=scrapers, seconds=seconds, pause=pause, context=context)
        finally:
            for sock in [*idle, half]:
                sock.close()
    finally:
        exporter.stop()


@contextlib.contextmanager
def past_fd_limit(rig: Rig, connections: int, headroom: int = 40) -> Iterator[int]:
    """The running exporter's RLIMIT_NOFILE lowered to the descriptors it holds plus `headroom`, and `connections`
    opened past it (accept meets EMFILE); yields the limit. Closes them and restores the limit on the way out."""
    pid = rig.exporter.proc.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    limit = psutil.Process(pid).num_fds() + headroom
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, before[1]))
    socks: list[socket.socket] = []
    try:
        socks = [socket.create_connection(("127.0.0.1", rig.exporter.port), timeout=10) for _ in range(connections)]
        yield limit
    finally:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
