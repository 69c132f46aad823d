"""HTTP routes: landing page `/`, the metrics endpoint, `/-/healthy`, each server's status page `/servers/<name>`
(also `/servers/?name=<name>`, which holds any name: the alert rules' `status_url` and the dashboard link it so; its
report as `diagnose --json` writes it with `format=json`) and its static files, behind `--web.config.file`'s
basic auth and headers; and `serve`, which listens.

The server itself is `web.server` (bounded worker pool, deadlines, connection cap); the metrics endpoint is
`web.exposition`.
"""

from __future__ import annotations

import html
import threading
import time
from urllib.parse import parse_qs, quote, unquote, unquote_plus

from prometheus_client import CollectorRegistry

from stallwatch import __version__
from stallwatch.config.web import WebConfig
from stallwatch.discovery.server import ProbeTarget
from stallwatch.discovery.watcher import Watcher
from stallwatch.report.live import StatusPages
from stallwatch.report.model import Report
from stallwatch.report.render import render_json
from stallwatch.text import display
from stallwatch.web import statuspage
from stallwatch.web.auth import BasicAuth
from stallwatch.web.exposition import TEXT, SharedCollection, metrics_handler
from stallwatch.web.http import Handler, Request, Response
from stallwatch.web.server import HttpServer, Limits
from stallwatch.web.tls import TLSReloader

ALLOWED_METHODS = ("GET", "HEAD")
STATUS_PREFIX = "/servers/"
# The status page shows other processes' text: no script but its own, and the page not cached on the way.
OWN_CONTENT_ONLY = [("Content-Security-Policy", "default-src 'self'"), ("X-Content-Type-Options", "nosniff")]


def _landing(watcher: Watcher, telemetry_path: str, status: bool) -> Response:
    """Names and paths come from other processes and may be surrogate-escaped bytes: `printable` first."""
    def cell(text: str) -> str:
        return f"<td>{html.escape(display(text))}</td>"

    def name(text: str) -> str:
        if not status:
            return cell(text)
        return f'<td><a href="{html.escape(status_path(text))}">{html.escape(display(text))}</a></td>'

    rows = "".join(
        f"<tr>{name(look.name)}{cell(look.engine.name)}{cell('up' if look.running else 'down')}"
        f"{cell(', '.join(_probe_text(p) for p in look.launch.probes))}"
        f"{cell(', '.join(source.path for source in look.launch.log_sources))}</tr>"
        for look in (s.look() for s in watcher.servers())
    ) or '<tr><td colspan="5">none yet</td></tr>'
    body = (
        "<!DOCTYPE html><html><head><title>stallwatch</title></head><body>"
        f"<h1>stallwatch</h1><p>Version {html.escape(__version__)}. "
        "Silent-stall exporter for LLM inference servers.</p>"
        f'<p><a href="{html.escape(telemetry_path)}">Metrics</a></p>'
        "<h2>Watched servers</h2><table border=1><tr><th>server</th><th>engine</th><th>process</th>"
        f"<th>probes</th><th>logs</th></tr>{rows}</table></body></html>"
    ).encode("utf-8", "backslashreplace")
    return Response(200, [("Content-Type", "text/html; charset=utf-8")], body)


DOT_SEGMENTS = (".", "..")


def status_path(name: str) -> str:
    """`/servers/<name>`, the name escaped whole (`/` too). A name that is a dot segment goes in the query,
    `/servers/?name=..`, as the alert rules and the dashboard put every name: clients remove `.` and `..` from a path
    (RFC 3986 5.2.4), and browsers their escaped forms too (`%2E`, WHATWG URL's single- and double-dot segments), so
    no spelling of it in the path reaches its page (docs/research/audit-2026-12-02.md #15)."""
    escaped = quote(name.encode("utf-8", "surrogateescape"), safe="")
    return f"{STATUS_PREFIX}?name={escaped}" if name in DOT_SEGMENTS else STATUS_PREFIX + escaped


def _status_handler(status: StatusPages) -> Handler:
    def page(request: Request) -> Response:
        escaped = request.path[len(STATUS_PREFIX):]
        if not escaped and (named := parse_qs(request.url.query, errors="surrogateescape").get("name")):
            server = status.find(named[0])  # `status_path` of `.` and `..`
        else:  # links of old alerts: `urlquery` wrote a space as `+`; a name with a real `+` is found first.
            server = status.find(unquote(escaped, errors="surrogateescape")) or status.find(
                unquote_plus(escaped, errors="surrogateescape"))
        if server is None:
            return Response(404, [TEXT], b"No watched server of that name.\n")
        view = status.view(server)
        if request.query.get("format") == ["json"]:  # what `stallwatch diagnose` reads of a server it cannot see
            return Response(200, [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
                            render_json(Report(__version__, time.time(), [view.report])).encode())
        return Response(200, [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store"),
                              *OWN_CONTENT_ONLY], statuspage.render(view))

    return page


def _static(name: str) -> Handler:
    found = statuspage.static_file(name)
    assert found is not None, name
    body, kind = found
    return lambda _: Response(200, [("Content-Type", kind), *OWN_CONTENT_ONLY], body)


def _refusal(allowed: bool | None) -> Response | None:
    """None when `BasicAuth.check` let the request in, else its answer."""
    if allowed:
        return None
    if allowed is None:  # no turn at bcrypt for this client now: answered at once rather than holding a worker
        return Response(429, [TEXT, ("Retry-After", "1")], b"Too many password checks at once; try again.\n")
    return Response(401, [TEXT, ("WWW-Authenticate", "Basic")], b"Unauthorized\n")


def make_app(registry: CollectorRegistry, watcher: Watcher, telemetry_path: str,
             web_config: WebConfig | None = None, status: StatusPages | None = None) -> Handler:
    """The request handler: routes, GET/HEAD only, and `web_config`'s basic auth and extra headers on every
    response (exporter-toolkit protects every path, `/-/healthy` included, and sets headers before auth)."""
    web_config = web_config or WebConfig()
    auth = BasicAuth(web_config.users) if web_config.users else None
    extra = list(web_config.headers.items())
    routes: dict[str, Handler] = {
        telemetry_path: metrics_handler(SharedCollection(registry)),
        "/": lambda _: _landing(watcher, telemetry_path, status is not None),
        "/-/healthy": lambda _: Response(200, [TEXT], b"Healthy.\n"),
    }
    if status is not None:
        routes.update({f"/static/{name}": _static(name) for name in statuspage.STATIC_FILES})
    status_page = _status_handler(status) if status is not None else None

    def route(request: Request) -> Response:
        if auth is not None and (refused := _refusal(auth.check(request.headers.get("authorization"), request.peer))):
            return refused
        handler = routes.get(request.path)
        if handler is None and status_page is not None and request.path.startswith(STATUS_PREFIX):
            handler = status_page
        if handler is None:
            return Response(404, [TEXT], b"Not found.\n")
        if request.method not in ALLOWED_METHODS:
            return Response(405, [TEXT, ("Allow", ", ".join(ALLOWED_METHODS))], b"Method not allowed.\n")
        return handler(request)

    def app(request: Request) -> Response:
        response = route(request)
        response.headers.extend(extra)
        return response

    return app


def _probe_text(target: ProbeTarget) -> str:
    if target.netns_pid is None:
        return target.probe.url
    return (f"{target.probe.url}: listens on loopback only inside its network namespace, so no other address "
            "reaches it; start it with --host 0.0.0.0, or set probe.enter_netns (needs CAP_SYS_ADMIN)")


def serve(app: Handler, host: str, port: int, web_config: WebConfig | None = None,
          limits: Limits | None = None) -> tuple[HttpServer, threading.Thread]:
    """Listen (host "" = every address, dual-stack) and serve `app`; TLS when `web_config` has a certificate."""
    tls = TLSReloader(web_config.tls).context if web_config is not None and web_config.tls.enabled else None
    server = HttpServer(app, host, port, limits, tls=tls)
    return server, server.start()
