"""`--web.config.file`: TLS, basic auth and extra response headers, in the Prometheus exporter-toolkit format.

The keys, their meaning and their checks follow exporter-toolkit's `docs/web-configuration.md`,
`web/tls_config.go` (`getTLSConfig`, `ConfigToTLSConfig`, paths relative to the file's directory) and
`web/handler.go` (`extraHTTPHeaders`, `validateUsers`). Errors read `file:line: key: reason` through the main
config's reader (`config.reader.Reader`), exit 2. What serves it: `web.tls` (the reloading context) and
`web.auth` (the bcrypt checks, their caches and the bound on checks waiting for bcrypt).

Python's `ssl` module cannot accept a client certificate without verifying it, so `RequireAnyClientCert` is
refused with that reason, and `RequestClientCert` does not ask for a certificate (stallwatch does not use
one, so what it lets in is the same as Go's: any client).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from stallwatch.config.reader import Reader, compose, read_text
from stallwatch.config.values import boolean, choice

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit web/handler.go `extraHTTPHeaders`: the only headers it lets a file set (None: any value).
EXTRA_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
# Keys of exporter-toolkit that stallwatch does not implement: refused by name rather than silently ignored.
UNSUPPORTED = {"cert": "inline certificates are not supported; use cert_file",
               "key": "inline keys are not supported; use key_file",
               "client_ca": "inline CAs are not supported; use client_ca_file",
               "cipher_suites": "not supported: Python's ssl module chooses TLS 1.3 suites itself",
               "curve_preferences": "not supported", "prefer_server_cipher_suites": "not supported",
               "client_allowed_sans": "not supported", "rate_limit": "not supported"}
BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}$")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _header_value(value: Any) -> str:
    text = _text(value)
    if any(c in text for c in "\r\n\0"):
        raise ValueError("expected a single-line value")
    return text



@dataclass(frozen=True)
class TLSServerConfig:
    cert_file: str = ""
    key_file: str = ""
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.key_file)

    def files(self) -> tuple[str, ...]:
        return tuple(f for f in (self.cert_file, self.key_file, self.client_ca_file) if f)


@dataclass(frozen=True)
class WebConfig:
    tls: TLSServerConfig = TLSServerConfig()
    users: Mapping[str, bytes] = field(default_factory=dict)  # username -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)
    file: str = ""


def _tls(r: Reader, node: yaml.Node, base_dir: str) -> TLSServerConfig:
    path = "tls_server_config"
    keys = r.mapping(node, path, {*(f for f in TLSServerConfig.__dataclass_fields__), *UNSUPPORTED})
    values: dict[str, str] = {}
    for key, value_node in keys.items():
        if key in UNSUPPORTED:
            raise r.fail(value_node, f"{path}.{key}", UNSUPPORTED[key])
        convert = {"client_auth_type": choice(CLIENT_AUTH_TYPES), "min_version": choice(tuple(TLS_VERSIONS)),
                   "max_version": choice(tuple(TLS_VERSIONS))}.get(key, _text)
        values[key] = r.scalar(value_node, f"{path}.{key}", convert)
    for key in ("cert_file", "key_file", "client_ca_file"):
        if values.get(key):  # exporter-toolkit `SetDirectory`: relative to the web config file
            values[key] = os.path.join(base_dir, values[key])
    tls = TLSServerConfig(**values)
    _check_tls(r, node, tls)
    return tls


def _check_tls(r: Reader, node: yaml.Node, tls: TLSServerConfig) -> None:
    """The combinations exporter-toolkit's `ConfigToTLSConfig` refuses, and the one Python cannot do."""
    path = "tls_server_config"
    if tls.enabled and not tls.cert_file:
        raise r.fail(node, f"{path}.cert_file", "missing (key_file is set)")
    if tls.enabled and not tls.key_file:
        raise r.fail(node, f"{path}.key_file", "missing (cert_file is set)")
    if tls.client_auth_type == "RequireAnyClientCert":
        raise r.fail(node, f"{path}.client_auth_type", "RequireAnyClientCert is not supported: Python's ssl "
                     "module cannot accept a client certificate without verifying it; use "
                     "RequireAndVerifyClientCert with client_ca_file")
    verifies = tls.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
    if tls.client_ca_file and not verifies:
        raise r.fail(node, f"{path}.client_ca_file", "client CAs configured without a client_auth_type that "
                     "verifies (VerifyClientCertIfGiven or RequireAndVerifyClientCert)")
    if verifies and not tls.client_ca_file:
        raise r.fail(node, f"{path}.client_ca_file", f"missing: required by {tls.client_auth_type}")
    if TLS_VERSIONS[tls.min_version] > TLS_VERSIONS[tls.max_version]:
        raise r.fail(node, f"{path}.min_version", f"above max_version {tls.max_version}")


def _users(r: Reader, node: yaml.Node) -> dict[str, bytes]:
    if not isinstance(node, yaml.MappingNode):
        raise r.fail(node, "basic_auth_users", "expected a mapping of username to bcrypt hash")
    users: dict[str, bytes] = {}
    for key_node, value_node in node.value:
        user = r.scalar(key_node, "basic_auth_users", _text)
        path = f"basic_auth_users.{user}"
        if ":" in user or not user:  # RFC 7617: a user-id with a colon cannot be sent
            raise r.fail(key_node, path, "expected a username without ':'")
        if user in users:
            raise r.fail(key_node, path, "duplicate user")
        digest = r.scalar(value_node, path, _text)
        if not BCRYPT_HASH.match(digest):  # exporter-toolkit `validateUsers` (bcrypt.Cost)
            raise r.fail(value_node, path, "expected a bcrypt hash ($2y$10$...), e.g. from `htpasswd -nBC 10 USER`")
        users[user] = digest.encode()
    return users


def _headers(r: Reader, node: yaml.Node) -> dict[str, str]:
    keys = r.mapping(node, "http_server_config.headers", set(EXTRA_HEADERS))
    headers: dict[str, str] = {}
    for name, value_node in keys.items():
        path = f"http_server_config.headers.{name}"
        value = r.scalar(value_node, path, _header_value)
        allowed = EXTRA_HEADERS[name]
        if allowed is not None and value not in allowed:
            raise r.fail(value_node, path, f"expected one of {', '.join(allowed)}, got {value!r}")
        headers[name] = value
    return headers


def _http(r: Reader, node: yaml.Node) -> dict[str, str]:
    keys = r.mapping(node, "http_server_config", {"headers", "http2"})
    if "http2" in keys:  # accepted for compatibility: stallwatch speaks HTTP/1.1, which Prometheus uses anyway
        r.scalar(keys["http2"], "http_server_config.http2", boolean)
    return _headers(r, keys["headers"]) if "headers" in keys else {}


def parse(text: str, file: str) -> WebConfig:
    """The web config in `text`; certificate files are loaded once here so that a bad one is refused at start."""
    r = Reader(file)
    return _config(r, compose(r, text), file)


def _config(r: Reader, root: yaml.Node | None, file: str) -> WebConfig:
    keys = {} if root is None else r.mapping(root, "", {"tls_server_config", "basic_auth_users",
                                                        "http_server_config"})
    config = WebConfig(
        tls=_tls(r, keys["tls_server_config"], os.path.dirname(os.path.abspath(file)))
        if "tls_server_config" in keys else TLSServerConfig(),
        users=_users(r, keys["basic_auth_users"]) if "basic_auth_users" in keys else {},
        headers=_http(r, keys["http_server_config"]) if "http_server_config" in keys else {},
        file=file,
    )
    if config.tls.enabled:
        try:
            build_context(config.tls)
        except (OSError, ssl.SSLError, ValueError) as exc:
            node = keys["tls_server_config"]
            raise r.fail(node, f"tls_server_config.{_culprit(exc, config.tls)}", f"cannot load: {exc}") from None
    return config


def _culprit(exc: Exception, tls: TLSServerConfig) -> str:
    filename = getattr(exc, "filename", None)
    if filename == tls.client_ca_file or isinstance(exc, _CAError):
        return "client_ca_file"
    if filename == tls.key_file or "KEY" in str(exc).upper():
        return "key_file"
    return "cert_file"


class _CAError(ValueError):
    pass


def load(path: str) -> WebConfig:
    return parse(read_text(path, "web config file"), path)


def build_context(tls: TLSServerConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_ca_file:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise _CAError(str(exc)) from None
    context.verify_mode = {"VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
                           "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}.get(tls.client_auth_type, ssl.CERT_NONE)
    return context
