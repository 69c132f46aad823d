"""Routes: status pages behind basic auth, and names that are not UTF-8 link and resolve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from stallwatch.config import Config
from stallwatch.config.web import WebConfig
from stallwatch.report.live import StatusPages
from stallwatch.runtime import Runtime
from stallwatch.web.routes import make_app
from support.looks import Looked, look


def test_names_that_are_not_utf8_link_and_resolve() -> None:
    """A pod name with bytes that are not UTF-8 (surrogate-escaped): the landing page links it, the link leads back
    to it, and so does the printable form an alert's label carries."""
    odd = Looked(look("llm/pod-\udcff\udcfe"))
    watcher = SimpleNamespace(servers=lambda: [odd])
    pages = StatusPages(Runtime(Config(), watcher))  # type: ignore[arg-type]
    assert pages.find(odd.name) is odd and pages.find("llm/pod-\\xff\\xfe") is odd and pages.find("llm/pod-") is None
    asked: list[str] = []
    recording = SimpleNamespace(find=lambda name: asked.append(name))
    app = make_app(CollectorRegistry(), watcher, "/metrics", None, recording)  # type: ignore[arg-type]
    def get(path: str):  # type: ignore[no-untyped-def]
        return app(SimpleNamespace(path=path, method="GET", headers={}, query={}))  # type: ignore[arg-type]

    landing = get("/")
    assert landing.status == 200
    assert '<a href="/servers/llm%2Fpod-%FF%FE">llm/pod-\\xff\\xfe</a>' in landing.body.decode()
    assert get("/servers/llm%2Fpod-%FF%FE").status == 404 and asked[0] == odd.name


def test_status_pages_sit_behind_basic_auth() -> None:
    pages = SimpleNamespace(find=lambda name: pytest.fail("reached the page without credentials"))
    app = make_app(CollectorRegistry(), SimpleNamespace(servers=list), "/metrics",  # type: ignore[arg-type]
                   WebConfig(users={"admin": b"$2b$04$" + b"x" * 53}), pages)  # type: ignore[arg-type]
    for path in ("/servers/x", "/static/status.js"):
        request = SimpleNamespace(path=path, method="GET", headers={}, query={}, peer="10.0.0.1")
        assert app(request).status == 401  # type: ignore[arg-type]
