"""HTTP: landing page `/`, the metrics endpoint, `/-/healthy` and each server's status page `/servers/<name>`, behind
`--web.config.file`'s basic auth.

The server itself is `stallwatch.httpserver` (bounded worker pool, deadlines, connection cap). The exposition
stays prometheus_client's (`choose_encoder`); `/metrics` requests that arrive while a collection runs wait for its
result instead of starting their own (`SharedCollection`).
"""

from __future__ import annotations

import gzip
import html
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import quote, unquote, unquote_plus

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from stallwatch import __version__, statuspage
from stallwatch.config.web import BasicAuth, TLSReloader, WebConfig
from stallwatch.discovery.server import ProbeTarget
from stallwatch.discovery.watcher import Watcher
from stallwatch.httpserver import Handler, Limits, Request, Response, Server
from stallwatch.status import StatusPages
from stallwatch.text import display

log = logging.getLogger(__name__)

TEXT = ("Content-Type", "text/plain; charset=utf-8")
ALLOWED_METHODS = ("GET", "HEAD")
STATUS_PREFIX = "/servers/"
# The status page shows other processes' text: no script but its own, and the page not cached on the way.
OWN_CONTENT_ONLY = [("Content-Security-Policy", "default-src 'self'"), ("X-Content-Type-Options", "nosniff")]
DEFAULT_SCRAPE_WAIT = 30.0  # seconds a request waits for a shared collection without Prometheus' timeout header
MAX_SCRAPE_WAIT = 120.0


class _Flight:
    """One collection and the encodings made of it, shared by the requests that waited for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.metrics: list[Metric] = []
        self.error: BaseException | None = None
        self._encoded: dict[tuple[object, ...], bytes] = {}
        self._lock = threading.Lock()

    def encoded(self, key: tuple[object, ...], make: Callable[[], bytes]) -> bytes:
        with self._lock:
            if key not in self._encoded:
                self._encoded[key] = make()
            return self._encoded[key]


class SharedCollection:
    """Single-flight collection: while one runs, other scrapes wait (bounded by `timeout`) for its result instead of
    starting their own. Nothing is cached after it ends, so every scrape still sees values from after it arrived."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._flight: _Flight | None = None
        self.collections = 0  # how many ran (tests and the benchmark read it)

    def get(self, timeout: float) -> _Flight:
        with self._lock:
            flight, leader = self._flight, self._flight is None
            if flight is None:
                flight = self._flight = _Flight()
        if leader:
            self._run(flight)
        elif not flight.done.wait(timeout):
            raise TimeoutError(f"collection still running after {timeout:g}s")
        if flight.error is not None:
            raise flight.error
        return flight

    def _run(self, flight: _Flight) -> None:
        try:
            flight.metrics = list(self.registry.collect())
        except BaseException as exc:  # handed to every waiter; the root collector normally catches everything
            flight.error = exc
        finally:
            with self._lock:
                self._flight = None
                self.collections += 1
            flight.done.set()


class _Snapshot:
    """What the encoders read: a fixed list of families (they call `collect()` once)."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def restrict(metrics: Iterable[Metric], names: Iterable[str] | None) -> list[Metric]:
    """`?name[]=` as prometheus_client's `RestrictedRegistry`: samples whose name is listed (so a counter is asked
    for as `..._total`). Done on the shared result, because the root collector describes no names up front."""
    if names is None:
        return list(metrics)
    wanted = set(names)
    out = []
    for metric in metrics:
        samples = [s for s in metric.samples if s.name in wanted]
        if samples:
            copy = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            copy.samples = samples
            out.append(copy)
    return out


def gzip_accepted(header: str) -> bool:
    """RFC 9110 12.5.3: `gzip;q=0` (or `*;q=0` without a gzip entry) refuses gzip, which prometheus_client's
    `gzip_accepted` ignores; Go's promhttp negotiates with the q values."""
    star: float | None = None
    for entry in header.split(","):
        coding, *params = (part.strip() for part in entry.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if coding.lower() == "gzip":
            return q > 0
        if coding == "*":
            star = q
    return star is not None and star > 0


def _scrape_wait(request: Request) -> float:
    try:
        wanted = float(request.headers.get("x-prometheus-scrape-timeout-seconds", DEFAULT_SCRAPE_WAIT))
    except ValueError:
        wanted = DEFAULT_SCRAPE_WAIT
    return min(MAX_SCRAPE_WAIT, max(0.1, wanted)) if wanted == wanted else DEFAULT_SCRAPE_WAIT


def _metrics_handler(shared: SharedCollection) -> Handler:
    def metrics(request: Request) -> Response:
        try:
            flight = shared.get(_scrape_wait(request))
        except TimeoutError as exc:
            return Response(503, [TEXT], f"{exc}\n".encode())
        names = request.query.get("name[]")
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        key: tuple[object, ...] = (content_type, tuple(sorted(set(names))) if names is not None else None)
        body = flight.encoded(key, lambda: encoder(_Snapshot(restrict(flight.metrics, names))))  # type: ignore[arg-type]
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            plain = body
            body = flight.encoded((*key, "gzip"), lambda: gzip.compress(plain, compresslevel=6))
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, headers, body)

    return metrics


def _landing(watcher: Watcher, telemetry_path: str, status: bool) -> Response:
    """Names and paths come from other processes and may be surrogate-escaped bytes: `printable` first."""
    def cell(text: str) -> str:
        return f"<td>{html.escape(display(text))}</td>"

    def name(text: str) -> str:
        if not status:
            return cell(text)
        return f'<td><a href="{html.escape(status_path(text))}">{html.escape(display(text))}</a></td>'

    rows = "".join(
        f"<tr>{name(s.name)}{cell(s.engine.name)}{cell('up' if s.is_running() else 'down')}"
        f"{cell(', '.join(_probe_text(p) for p in s.launch.probes))}"
        f"{cell(', '.join(source.path for source in s.launch.log_sources))}</tr>"
        for s in watcher.servers()
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


def status_path(name: str) -> str:
    """`/servers/<name>`, the name escaped whole (`/` too) as the alert rules' `urlquery` does."""
    return STATUS_PREFIX + quote(name.encode("utf-8", "surrogateescape"), safe="")


def _status_handler(status: StatusPages) -> Handler:
    def page(request: Request) -> Response:
        escaped = request.path[len(STATUS_PREFIX):]
        # `urlquery` writes a space as `+`; a name with a real `+` is found by the first spelling.
        server = status.find(unquote(escaped, errors="surrogateescape")) or status.find(
            unquote_plus(escaped, errors="surrogateescape"))
        if server is None:
            return Response(404, [TEXT], b"No watched server of that name.\n")
        return Response(200, [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store"),
                              *OWN_CONTENT_ONLY],
                        statuspage.render(status.view(server)))

    return page


def _static(name: str) -> Handler:
    found = statuspage.static_file(name)
    assert found is not None, name
    body, kind = found
    return lambda _: Response(200, [("Content-Type", kind), *OWN_CONTENT_ONLY], body)


def make_app(registry: CollectorRegistry, watcher: Watcher, telemetry_path: str,
             web_config: WebConfig | None = None, status: StatusPages | None = None) -> Handler:
    """The request handler: routes, GET/HEAD only, and `web_config`'s basic auth and extra headers on every
    response (exporter-toolkit protects every path, `/-/healthy` included, and sets headers before auth)."""
    web_config = web_config or WebConfig()
    auth = BasicAuth(web_config.users) if web_config.users else None
    extra = list(web_config.headers.items())
    routes: dict[str, Handler] = {
        telemetry_path: _metrics_handler(SharedCollection(registry)),
        "/": lambda _: _landing(watcher, telemetry_path, status is not None),
        "/-/healthy": lambda _: Response(200, [TEXT], b"Healthy.\n"),
    }
    if status is not None:
        routes.update({f"/static/{name}": _static(name) for name in statuspage.STATIC_FILES})
    status_page = _status_handler(status) if status is not None else None

    def route(request: Request) -> Response:
        if auth is not None and not auth.check(request.headers.get("authorization")):
            return Response(401, [TEXT, ("WWW-Authenticate", "Basic")], b"Unauthorized\n")
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
          limits: Limits | None = None) -> tuple[Server, threading.Thread]:
    """Listen (host "" = every address, dual-stack) and serve `app`; TLS when `web_config` has a certificate."""
    tls = TLSReloader(web_config.tls).context if web_config is not None and web_config.tls.enabled else None
    server = Server(app, host, port, limits, tls=tls)
    return server, server.start()
