"""The exporter's web config: TLS, client certificates, basic auth, reloads, dual stack."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import pytest
from prometheus_client import CollectorRegistry

from stallwatch.config.web import WebConfig, parse
from stallwatch.web.routes import make_app, serve
from support.certs import make_ca, make_cert
from support.client import request
from support.harness import Exporter, gpus, poll
from support.load import basic, sequential_scrapes, slow_readers, wrong_passwords


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


def _watcher(*servers: object) -> SimpleNamespace:
    return SimpleNamespace(servers=lambda: list(servers))


HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


def _exporter_exit(tmp: Path, web_yml: str) -> subprocess.CompletedProcess[str]:
    path = tmp / "web.yml"
    path.write_text(web_yml)
    return subprocess.run([sys.executable, "-m", "stallwatch", "--web.listen-address=127.0.0.1:0",
                           f"--web.config.file={path}"], capture_output=True, text=True, timeout=60)


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_good_web_config_and_paths_relative_to_the_file(pki: SimpleNamespace) -> None:
    config = parse(f"tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  min_version: TLS13\n"
                   f"basic_auth_users: {{alice: '{HASH}'}}\n"
                   "http_server_config: {http2: false, headers: {X-Frame-Options: deny}}\n",
                   str(pki.tmp / "web.yml"))
    assert config.tls.cert_file == str(pki.tmp / "server.pem") and config.users["alice"] == HASH.encode()
    assert parse("", "empty.yml") == WebConfig(file="empty.yml")


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


@pytest.mark.process
def test_a_scraper_whose_password_is_not_cached_gets_through_a_flood_of_wrong_ones(tmp_path: Path) -> None:
    """A flood of wrong passwords took every turn at bcrypt, so a scraper whose password was not cached yet (after any
    restart, every scraper) got 429 for as long as it lasted (docs/research/audit-2026-12-02.md #9). Here 16
    connections from the scraper's own address guess cost-10 passwords as fast as they are answered (far faster than
    bcrypt checks them), as alice and with random user names. bob, whose password was never checked, is let in at
    his first try while the flood goes on, after at most the check running when he came and his own (his user name
    is not the one guessed: one whose is shares its turns with the guesses)."""
    hashes = {name: bcrypt.hashpw(b"right", bcrypt.gensalt(10)).decode() for name in ("alice", "bob")}
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n" + "".join(f"  {name}: '{digest}'\n" for name, digest in hashes.items()))
    exporter = Exporter(tmp_path, args=(f"--web.config.file={web}",), ready=False)
    try:
        poll(lambda: request(exporter.port)[0] == 401 or exporter._died(), what="exporter with basic auth")
        with wrong_passwords(exporter.port, "alice", clients=16) as answers:
            poll(lambda: answers["alice", 401] and answers["random", 401] >= 2 and answers["alice", 429] >= 50,
                 timeout=30, what="the flood under way, both kinds of guesses failing")
            status, _, _ = request(exporter.port, "/metrics", headers={"Authorization": basic("bob", "right")},
                                   timeout=60)  # two bcrypts on a loaded machine: seconds, but a 429 comes at once
            assert status == 200, dict(answers)
            print(f"\nflood answers meanwhile: {dict(answers)}")
    finally:
        exporter.stop()


@pytest.mark.process
def test_readers_that_never_read_leave_scrapes_far_inside_the_write_timeout(tmp_path: Path) -> None:
    """16 connections asking for `/metrics` and never reading held every HTTP worker in a blocking send for the write
    timeout, so scrapes took 8-20 s (docs/research/audit-2026-12-02.md #8). With the write timeout at 60 s, 10 scrapes
    beside 16 such readers are each answered within 20 s, a third of it: a slow reader holds its unsent response,
    never a worker. 64 GPUs make `/metrics` about 190 KB, and each reader queues 200 requests, about 38 MB of answers,
    far more than the kernel's send buffer takes (4 MiB at most by default)."""
    exporter = Exporter(tmp_path, nvml={"gpus": gpus(64)}, args=("--web.write-timeout=60s",))
    try:
        exporter.wait_for(lambda s: len(s.samples("stallwatch_gpu_up")) == 64, what="64 GPUs read")
        with slow_readers(exporter.port, 16, requests=200):
            figures = sequential_scrapes(exporter.port, 10, pause=0.1, timeout=20)
        print("\n" + figures.line("scrapes beside 16 connections that never read, write timeout 60 s"))
        assert len(figures.latencies) == 10 and not figures.errors, figures.errors[:3]
    finally:
        exporter.stop()
