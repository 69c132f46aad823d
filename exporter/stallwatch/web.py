"""HTTP: landing page `/`, the metrics endpoint, and `/-/healthy`."""

from __future__ import annotations

import html
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from stallwatch import __version__
from stallwatch.servers import ProbeTarget, Watcher

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def make_app(registry: CollectorRegistry, watcher: Watcher, telemetry_path: str) -> Callable[..., Iterable[bytes]]:
    metrics_app = make_wsgi_app(registry)

    def landing(start_response: StartResponse) -> list[bytes]:
        rows = "".join(
            f"<tr><td>{html.escape(s.name)}</td><td>{html.escape(s.engine.name)}</td>"
            f"<td>{'up' if s.is_running() else 'down'}</td>"
            f"<td>{html.escape(', '.join(_probe_text(p) for p in s.probes))}</td>"
            f"<td>{html.escape(', '.join(source.path for source in s.log_sources))}</td></tr>"
            for s in watcher.servers()
        ) or '<tr><td colspan="5">none yet</td></tr>'
        body = (
            "<!DOCTYPE html><html><head><title>stallwatch</title></head><body>"
            f"<h1>stallwatch</h1><p>Version {html.escape(__version__)}. "
            "Silent-stall exporter for LLM inference servers.</p>"
            f'<p><a href="{html.escape(telemetry_path)}">Metrics</a></p>'
            "<h2>Watched servers</h2><table border=1><tr><th>server</th><th>engine</th><th>process</th>"
            f"<th>probes</th><th>logs</th></tr>{rows}</table></body></html>"
        ).encode()
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
        return [body]

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == telemetry_path:
            return metrics_app(environ, start_response)
        if path == "/":
            return landing(start_response)
        if path == "/-/healthy":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Healthy.\n"]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"Not found.\n"]

    return app


def _probe_text(target: ProbeTarget) -> str:
    if target.netns_pid is None:
        return target.probe.url
    return (f"{target.probe.url}: listens on loopback only inside its network namespace, so no other address "
            "reaches it; start it with --host 0.0.0.0, or set probe.enter_netns (needs CAP_SYS_ADMIN)")


class _ThreadingServerV6(_ThreadingServer):
    address_family = socket.AF_INET6


def serve(app: Callable[..., Iterable[bytes]], host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    server_class = _ThreadingServerV6 if ":" in host else _ThreadingServer
    httpd = make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="http", daemon=True)
    thread.start()
    return httpd, thread
