"""HTTP: methods, HEAD, gzip negotiation, `name[]`, single-flight scrapes, dual-stack, and `--web.config.file`
(TLS with each client-certificate mode, certificate reload, basic auth, headers, bad files → exit 2)."""

from __future__ import annotations

import gzip
import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from stallwatch.config.reader import ConfigError
from stallwatch.config.web import WebConfig, parse
from stallwatch.web.auth import BasicAuth
from stallwatch.web.exposition import SharedCollection, gzip_accepted, restrict
from stallwatch.web.http import HeadError, parse_head
from stallwatch.web.routes import make_app, serve
from stallwatch.web.server import HttpServer, Limits
from support.certs import make_ca, make_cert
from support.harness import Exporter, poll


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    tmp = tmp_path_factory.mktemp("pki")
    ca, other_ca = make_ca(tmp, "ca"), make_ca(tmp, "other-ca")
    return SimpleNamespace(tmp=tmp, ca=ca, server=make_cert(tmp, "server", ca), client=make_cert(tmp, "client", ca),
                           stranger=make_cert(tmp, "stranger", other_ca))


def client_context(pki: SimpleNamespace, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca[0]))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return context


def request(port: int, path: str = "/-/healthy", method: str = "GET", headers: dict[str, str] | None = None,
            context: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection(host, port, timeout=10)
    else:
        conn = http.client.HTTPSConnection(host, port, timeout=10, context=context)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


# --- an in-process server over a small registry (fast cases; the real exporter is used below) ------------------


class _SlowCollector:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls = 0

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        time.sleep(self.delay)
        gauge = GaugeMetricFamily("demo_value", "A value.", labels=["k"])
        gauge.add_metric(["a"], 1.0)
        yield gauge
        yield GaugeMetricFamily("demo_other", "Another.", value=2.0)


def _watcher(*servers: object) -> SimpleNamespace:
    return SimpleNamespace(servers=lambda: list(servers))


@pytest.fixture
def local() -> Iterator[SimpleNamespace]:
    registry = CollectorRegistry()
    collector = _SlowCollector()
    registry.register(collector)
    odd = SimpleNamespace(name="pod-\udcff\udcfe", engine=SimpleNamespace(name="sglang"), is_running=lambda: True,
                          launch=SimpleNamespace(probes=[],
                                                 log_sources=[SimpleNamespace(path="/var/log/\udce9t\ud800.log")]))
    server, _ = serve(make_app(registry, _watcher(odd), "/metrics"), "127.0.0.1", 0)  # type: ignore[arg-type]
    try:
        yield SimpleNamespace(port=server.server_port, collector=collector)
    finally:
        server.shutdown()


def test_head_sends_no_body_and_the_landing_page_takes_get_and_head_only(local: SimpleNamespace) -> None:
    status, headers, body = request(local.port, "/", method="HEAD")
    assert (status, body) == (200, b"") and int(headers["content-length"]) > 0
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        status, headers, _ = request(local.port, "/", method=method)
        assert status == 405 and headers["allow"] == "GET, HEAD", method


def test_landing_page_survives_names_that_are_not_utf8(local: SimpleNamespace) -> None:
    status, _, body = request(local.port, "/")
    assert status == 200
    assert "pod-\\xff\\xfe" in body.decode() and "\\ud800" in body.decode()


def test_gzip_only_when_accepted(local: SimpleNamespace) -> None:
    for accept, gzipped in (("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False),
                            ("*", True), ("*;q=0", False), ("br, gzip;q=0.5", True), ("", False)):
        status, headers, body = request(local.port, "/metrics", headers={"Accept-Encoding": accept})
        assert status == 200
        assert (headers.get("content-encoding") == "gzip") is gzipped, accept
        text = gzip.decompress(body) if gzipped else body
        assert b"demo_value" in text
    assert not gzip_accepted("identity") and gzip_accepted("GZIP;Q=1")


def test_name_filtering(local: SimpleNamespace) -> None:
    _, _, body = request(local.port, "/metrics?name[]=demo_other")
    assert b"demo_other 2.0" in body and b"demo_value" not in body
    _, _, body = request(local.port, "/metrics?name[]=demo_other&name[]=demo_value")
    assert b"demo_other" in body and b"demo_value" in body
    _, _, body = request(local.port, "/metrics?name[]=nothing_like_it")
    assert body == b""


def test_unknown_path_and_malformed_requests() -> None:
    assert parse_head(b"GET /x?y=1 HTTP/1.1\r\nHost: a\r\nX-A: 1\r\nx-a: 2\r\n\r\n").headers["x-a"] == "1, 2"
    for bad, status in ((b"GET /\r\n\r\n", 400), (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
                        (b"GET / HTTP/1.1\r\n\r\n", 400), (b"GET / HTTP/1.1\r\nHost a\r\n\r\n", 400),
                        (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400)):
        with pytest.raises(HeadError) as info:
            parse_head(bad)
        assert info.value.status == status, bad


def test_scrapes_that_arrive_together_share_one_collection() -> None:
    registry = CollectorRegistry()
    collector = _SlowCollector(delay=0.5)
    registry.register(collector)
    shared = SharedCollection(registry)
    results = []
    threads = [threading.Thread(target=lambda: results.append(shared.get(5.0))) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 10 and collector.calls == 1 and len({id(r) for r in results}) == 1
    shared.get(5.0)  # a later scrape starts a new one: nothing is cached past a collection
    assert collector.calls == 2
    collector.delay = 2.0
    first = threading.Thread(target=lambda: shared.get(5.0))
    first.start()
    poll(lambda: shared._flight is not None, what="collection to start")
    with pytest.raises(TimeoutError):
        shared.get(0.2)  # bounded wait
    first.join()


def test_restrict_keeps_counter_samples_by_sample_name() -> None:
    from prometheus_client.core import CounterMetricFamily
    counter = CounterMetricFamily("demo_events", "Events.", value=3)
    assert [m.name for m in restrict([counter], ["demo_events_total"])] == ["demo_events"]
    assert restrict([counter], ["demo_events"]) == []


def test_slow_header_client_is_cut_at_the_head_deadline_and_holds_no_worker() -> None:
    registry = CollectorRegistry()
    app = make_app(registry, _watcher(), "/metrics")  # type: ignore[arg-type]
    server = HttpServer(app, "127.0.0.1", 0, Limits(workers=1, header_timeout=1.0))
    server.start()
    try:
        slow = socket.create_connection(("127.0.0.1", server.server_port))
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        start = time.monotonic()
        # one worker only: the trickling client must not take it
        assert request(server.server_port)[0] == 200
        slow.settimeout(0.2)
        closed = False
        while not closed and time.monotonic() - start < 4:
            try:
                slow.sendall(b"X-A: b\r\n")  # a line every 0.2 s: a per-read timeout would never fire
                closed = slow.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed
        assert time.monotonic() - start < 2.5
        slow.close()
    finally:
        server.shutdown()


# --- web config parsing ------------------------------------------------------------------------------------------

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


@pytest.mark.parametrize(("text", "expected"), [
    ("tls_server_config: {cert_file: a.pem}\n", ":1: tls_server_config.key_file: missing"),
    ("tls_server_config:\n  key_file: a.key\n", ":2: tls_server_config.cert_file: missing"),
    ("tls_server_config: {cert_file: /nonexistent.pem, key_file: /nonexistent.key}\n",
     "tls_server_config.cert_file: cannot load"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: Sometimes}\n",
     "tls_server_config.client_auth_type: expected one of NoClientCert"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAnyClientCert}\n",
     "tls_server_config.client_auth_type: RequireAnyClientCert is not supported"),
    ("tls_server_config: {cert_file: a, key_file: b, client_auth_type: RequireAndVerifyClientCert}\n",
     "tls_server_config.client_ca_file: missing"),
    ("tls_server_config: {cert_file: a, key_file: b, client_ca_file: c}\n",
     "tls_server_config.client_ca_file: client CAs configured without"),
    ("tls_server_config: {cert_file: a, key_file: b, min_version: TLS14}\n", "tls_server_config.min_version"),
    ("tls_server_config: {cert_file: a, key_file: b, cipher_suites: [x]}\n", "tls_server_config.cipher_suites"),
    ("basic_auth_users:\n  alice: plaintext\n", ":2: basic_auth_users.alice: expected a bcrypt hash"),
    (f"basic_auth_users:\n  alice: '{HASH}'\n  alice: '{HASH}'\n", ":3: basic_auth_users.alice: duplicate"),
    ("basic_auth_users: [alice]\n", "basic_auth_users: expected a mapping"),
    ("http_server_config:\n  headers:\n    Server: x\n", ":3: http_server_config.headers.Server: unknown key"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     "http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin"),
    ("http_server_config: {http2: maybe}\n", "http_server_config.http2"),
    ("tls_config: {}\n", ":1: tls_config: unknown key"),
    ("basic_auth_users: {a: [\n", "invalid YAML"),
    ("basic_auth_users: {a: !foo x}\n", "!foo"),
    ("basic_auth_users: " + "[" * 5000 + "]" * 5000 + "\n", "web.yml"),
    ("http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\nb\"\n", "single-line"),
])
def test_bad_web_config_names_line_and_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(text, "web.yml")
    assert str(info.value).startswith("web.yml") and expected in str(info.value)


def test_good_web_config_and_paths_relative_to_the_file(pki: SimpleNamespace) -> None:
    config = parse(f"tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS13\n"
                   f"basic_auth_users: {{alice: '{HASH}'}}\n"
                   "http_server_config: {http2: false, headers: {X-Frame-Options: deny}}\n",
                   str(pki.tmp / "web.yml"))
    assert config.tls.cert_file == str(pki.tmp / "server.pem") and config.users["alice"] == HASH.encode()
    assert parse("", "empty.yml") == WebConfig(file="empty.yml")


def test_basic_auth_checks_and_caches() -> None:
    import base64
    auth = BasicAuth({"alice": HASH.encode()})

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    assert auth.check(header("alice", "secret"))
    assert not auth.check(header("alice", "wrong")) and not auth.check(header("bob", "secret"))
    assert not auth.check(None) and not auth.check("Bearer x") and not auth.check("Basic !!!")
    assert not auth.check(header("alice", "x" * 100))  # over bcrypt's 72 bytes: refused, not an exception
    start = time.perf_counter()
    for _ in range(50):
        assert auth.check(header("alice", "secret"))
    assert time.perf_counter() - start < 0.5  # cached: 50 bcrypt checks would take longer even at cost 4


# --- the real exporter -------------------------------------------------------------------------------------------


def _exporter_exit(tmp: Path, web_yml: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "web.yml"
    path.write_text(web_yml)
    return subprocess.run([sys.executable, "-m", "stallwatch", "--web.listen-address=127.0.0.1:0",
                           f"--web.config.file={path}"], capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_bad_web_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    done = _exporter_exit(tmp_path, "tls_server_config:\n  cert_file: x.pem\n  key_file: x.key\n"
                                    "  client_auth_type: Never\n")
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'web.yml'}:4: tls_server_config.client_auth_type: expected one of" in done.stderr
    done = _exporter_exit(tmp_path, "basic_auth_users:\n  bob: '$1$notbcrypt'\n")
    assert done.returncode == 2 and "web.yml:2: basic_auth_users.bob: expected a bcrypt hash" in done.stderr
    fifo = tmp_path / "fifo.yml"
    import os
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "stallwatch", f"--web.config.file={fifo}"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "not a regular file" in done.stderr


@pytest.mark.process
def test_basic_auth_headers_and_tls_through_the_exporter(tmp_path: Path, pki: SimpleNamespace) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki.server[0]}\n  key_file: {pki.server[1]}\n"
                   f"basic_auth_users:\n  alice: '{HASH}'\n"
                   "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n")
    exporter = Exporter(tmp_path, args=(f"--web.config.file={web}",), ready=False)
    context = client_context(pki)
    good = {"Authorization": "Basic " + __import__("base64").b64encode(b"alice:secret").decode()}
    try:
        poll(lambda: request(exporter.port, context=context, headers=good)[0] == 200 or exporter._died(),
             what="TLS exporter")
        status, headers, body = request(exporter.port, "/metrics", context=context, headers=good)
        assert status == 200 and b"stallwatch_build_info" in body
        assert headers["x-frame-options"] == "deny" and headers["x-content-type-options"] == "nosniff"
        for path in ("/", "/metrics", "/-/healthy"):  # exporter-toolkit protects every path
            status, headers, _ = request(exporter.port, path, context=context)
            assert status == 401 and headers["www-authenticate"] == "Basic", path
            assert headers["x-frame-options"] == "deny"
        wrong = {"Authorization": "Basic " + __import__("base64").b64encode(b"alice:nope").decode()}
        assert request(exporter.port, context=context, headers=wrong)[0] == 401
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            request(exporter.port)  # plain HTTP to the TLS port: no answer
        tls12 = client_context(pki)
        tls12.maximum_version = ssl.TLSVersion.TLSv1_2
        assert request(exporter.port, context=tls12, headers=good)[0] == 200  # min_version TLS12 by default
    finally:
        exporter.stop()


@pytest.mark.parametrize(("mode", "no_cert", "good_cert", "stranger_cert"), [
    ("NoClientCert", True, True, True),
    ("RequestClientCert", True, True, True),
    ("VerifyClientCertIfGiven", True, True, False),
    ("RequireAndVerifyClientCert", False, True, False),
])
def test_client_certificate_modes(tmp_path: Path, pki: SimpleNamespace, mode: str, no_cert: bool, good_cert: bool,
                                  stranger_cert: bool) -> None:
    ca = f"  client_ca_file: {pki.ca[0]}\n" if "Verify" in mode else ""
    config = parse(f"tls_server_config:\n  cert_file: {pki.server[0]}\n  key_file: {pki.server[1]}\n"
                   f"  client_auth_type: {mode}\n{ca}", str(tmp_path / "web.yml"))
    app = make_app(CollectorRegistry(), _watcher(), "/metrics", config)  # type: ignore[arg-type]
    server, _ = serve(app, "127.0.0.1", 0, config)
    try:
        for cert, allowed in ((None, no_cert), (pki.client, good_cert), (pki.stranger, stranger_cert)):
            try:
                ok = request(server.server_port, context=client_context(pki, cert))[0] == 200
            except (ssl.SSLError, ConnectionError, http.client.HTTPException, OSError):
                ok = False
            assert ok is allowed, (mode, cert)
    finally:
        server.shutdown()


@pytest.mark.process
def test_certificate_is_reloaded_when_its_file_changes(tmp_path: Path, pki: SimpleNamespace) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "cert.key"
    cert.write_bytes(pki.server[0].read_bytes())
    key.write_bytes(pki.server[1].read_bytes())
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: cert.pem, key_file: cert.key}\n")
    exporter = Exporter(tmp_path, args=(f"--web.config.file={web}",), ready=False)

    def served_cert() -> bytes:
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as raw, \
                client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True) or b""

    try:
        first = poll(lambda: served_cert() or exporter._died(), what="TLS exporter")
        fresh = make_cert(tmp_path, "fresh", pki.ca)
        key.write_bytes(fresh[1].read_bytes())  # key first: a half-written pair keeps the old context (logged)
        cert.write_bytes(fresh[0].read_bytes())
        second = poll(lambda: (c := served_cert()) != first and c, timeout=10, what="new certificate served")
        assert second != first
        assert exporter.proc.poll() is None
    finally:
        exporter.stop()


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.process
@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")
def test_dual_stack_port(tmp_path: Path) -> None:
    exporter = Exporter(tmp_path, listen_host="")
    try:
        assert request(exporter.port, host="127.0.0.1")[0] == 200
        assert request(exporter.port, host="::1")[0] == 200
    finally:
        exporter.stop()


@pytest.mark.process
def test_real_exporter_head_405_gzip_and_names(tmp_path: Path) -> None:
    exporter = Exporter(tmp_path)
    try:
        status, _, body = request(exporter.port, "/", method="HEAD")
        assert (status, body) == (200, b"")
        assert request(exporter.port, "/", method="POST")[0] == 405
        _, headers, body = request(exporter.port, "/metrics", headers={"Accept-Encoding": "gzip;q=0"})
        assert "content-encoding" not in headers and body.startswith(b"#")
        _, headers, body = request(exporter.port, "/metrics?name[]=stallwatch_build_info")
        lines = [line for line in body.decode().splitlines() if not line.startswith("#")]
        assert lines and all(line.startswith("stallwatch_build_info") for line in lines)
    finally:
        exporter.stop()


def _plain_server(**limits: float) -> HttpServer:
    app = make_app(CollectorRegistry(), _watcher(), "/metrics")  # type: ignore[arg-type]
    server = HttpServer(app, "127.0.0.1", 0, Limits(**limits))  # type: ignore[arg-type]
    server.start()
    return server


def test_pipelined_requests_and_keep_alive() -> None:
    server = _plain_server()
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as sock:
            sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\nHEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        assert data.count(b"HTTP/1.1 200 OK") == 3 and data.count(b"Healthy.") == 2
        assert data.endswith(b"Healthy.\n") and b"Connection: close" in data
    finally:
        server.shutdown()


def test_connection_cap_closes_the_longest_waiting_for_a_new_one() -> None:
    server = _plain_server(max_connections=8)
    try:
        idle = [socket.create_connection(("127.0.0.1", server.server_port), timeout=5) for _ in range(20)]
        assert request(server.server_port)[0] == 200  # admitted: an idle one was closed for it
        poll(lambda: server.open_connections <= 8, what="cap respected")
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""  # the oldest went first
        for sock in idle:
            sock.close()
    finally:
        server.shutdown()
