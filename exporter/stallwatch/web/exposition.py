"""The metrics endpoint's exposition: prometheus_client's encoders (`choose_encoder`) over one shared collection.

`/metrics` requests that arrive while a collection runs wait for its result instead of starting their own
(`SharedCollection`); each encoding of it (text or OpenMetrics, filtered by `name[]`, gzipped) is made once.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from stallwatch.web.http import Handler, Request, Response

TEXT = ("Content-Type", "text/plain; charset=utf-8")
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


def encoder_for(accept: str) -> tuple[Callable[[Collector], bytes], str]:
    """prometheus_client's choice for `accept`, else the text format: `choose_encoder` raises on a version it cannot
    compare (`version=abc`), and a scraper with an odd header should still get metrics, not a 500."""
    try:
        return choose_encoder(accept)
    except (TypeError, ValueError):
        return choose_encoder("")


def metrics_handler(shared: SharedCollection) -> Handler:
    def metrics(request: Request) -> Response:
        try:
            flight = shared.get(_scrape_wait(request))
        except TimeoutError as exc:
            return Response(503, [TEXT], f"{exc}\n".encode())
        names = request.query.get("name[]")
        encoder, content_type = encoder_for(request.headers.get("accept", ""))
        key: tuple[object, ...] = (content_type, tuple(sorted(set(names))) if names is not None else None)
        body = flight.encoded(key, lambda: encoder(_Snapshot(restrict(flight.metrics, names))))  # type: ignore[arg-type]
        headers = [("Content-Type", content_type), ("Vary", "Accept-Encoding")]
        if gzip_accepted(request.headers.get("accept-encoding", "")):
            plain = body
            body = flight.encoded((*key, "gzip"), lambda: gzip.compress(plain, compresslevel=6))
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, headers, body)

    return metrics
