"""The web config file (`--web.config.file`): bad files name their line and key."""

from __future__ import annotations

import bcrypt
import pytest

from stallwatch.config.reader import ConfigError
from stallwatch.config.web import parse

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
