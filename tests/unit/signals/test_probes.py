"""Probes: a target that trickles headers times out at the deadline; a bad port fails without raising; a probe whose
URL moves keeps its name and counters."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

from stallwatch.config import Probe
from stallwatch.discovery.server import ProbeTarget
from stallwatch.signals.probes import ProbeManager, probe
from support.harness import free_port, poll


def test_a_target_that_trickles_headers_times_out_at_the_deadline() -> None:
    """A probe target that sends one header byte every 0.1 s, each read well within the socket timeout, would hold
    the probe for as long as it likes. The probe is cut at its one deadline for the whole request (1 s) and counted
    `timeout`."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        done = threading.Event()

        def trickle() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for _ in range(100):  # a header byte every 0.1 s for 10 s: each read is well within the timeout
                    if done.wait(0.1):
                        return
                    conn.sendall(b"X")

        server = threading.Thread(target=trickle, daemon=True)
        server.start()
        start = time.monotonic()
        result = probe(f"http://127.0.0.1:{listener.getsockname()[1]}/health", timeout=1.0)
        elapsed = time.monotonic() - start
        done.set()
        server.join(5)
    assert result.reason == "timeout" and not result.success
    assert elapsed < 5.0, elapsed  # cut at the 1 s deadline, not after the 10 s the headers trickle for


def test_a_probe_url_with_a_bad_port_fails_without_raising() -> None:
    """A probe URL with the port 99999, on which `http.client` raises ValueError, would end the probe's loop. The
    probe returns a failure with the reason `error` instead of raising."""
    assert probe("http://127.0.0.1:99999/health", timeout=1.0).reason == "error"


def test_a_probe_whose_url_moves_keeps_its_name_and_counters() -> None:
    """A pod restarted with a new IP moves its probe's URL: the probe is the same (`health`), its failures go on from
    where they were (a counter never goes back), and `probe_info` says the new URL."""
    def server_probing(url: str) -> SimpleNamespace:
        target = ProbeTarget(Probe(url=url, timeout=1.0, interval=3600.0))
        return SimpleNamespace(name="llm/a-0", launch=SimpleNamespace(probes=(target,)),
                               engine=SimpleNamespace(health_message=None))

    first, second = (f"http://127.0.0.1:{free_port()}/health" for _ in range(2))  # nothing listens: refused
    manager = ProbeManager()
    try:
        manager.reconcile([server_probing(first)])  # type: ignore[list-item]
        poll(lambda: [s.failures["refused"] for s in manager.states()] == [1], what="the first refusal")
        manager.reconcile([server_probing(second)])  # type: ignore[list-item]
        poll(lambda: [(s.url, s.failures["refused"]) for s in manager.states()] == [(second, 2)],
             what="the second refusal, at the new URL, counted on")
        assert [(s.server, s.name) for s in manager.states()] == [("llm/a-0", "health")]
    finally:
        manager.reconcile([])
