"""Routes: status pages behind basic auth, and names that are not UTF-8 or are dot segments link and resolve."""

from __future__ import annotations

import html
import re
from types import SimpleNamespace
from urllib.parse import quote, quote_plus, urljoin, urlsplit

import pytest
from prometheus_client import CollectorRegistry

from stallwatch.config import Config
from stallwatch.config.web import WebConfig
from stallwatch.report.live import StatusPages
from stallwatch.runtime import Runtime
from stallwatch.web.http import parse_head
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


@pytest.mark.parametrize("name", [".", ".."])
def test_a_server_named_a_dot_segment_links_to_its_own_page(name: str) -> None:
    """The landing page linked `/servers/.` and `/servers/..`, which clients (RFC 3986 5.2.4) and browsers (WHATWG
    URL, `%2E` too) turn into `/servers/` and `/`: the link of a server so named led to a 404 or the landing page
    (docs/research/audit-2026-12-02.md #15). Its link, resolved as a client does, still names it and leads to it
    (its report too); the escaped path `/servers/%2E` that RFC 3986 clients keep leads to it as well."""
    server = Looked(look(name))
    watcher = SimpleNamespace(servers=lambda: [server])
    asked: list[str] = []
    pages = SimpleNamespace(find=lambda wanted: asked.append(wanted))
    app = make_app(CollectorRegistry(), watcher, "/metrics", None, pages)  # type: ignore[arg-type]
    link = re.search(r'<td><a href="([^"]*)">', app(parse_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")).body.decode())
    assert link is not None
    resolved = urljoin("http://x/", html.unescape(link[1]))  # dot segments removed as a client does
    for target in (urlsplit(resolved)._replace(scheme="", netloc="").geturl(), "/servers/" + "%2E" * len(name)):
        assert app(parse_head(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())).status == 404
        assert asked.pop() == name, target


@pytest.mark.parametrize("name", [".", "..", "a b+c", "llm/kimi-0", "x?format=json&"])
def test_the_query_form_the_alerts_and_the_dashboard_link_holds_any_name(name: str) -> None:
    """The alerts' `status_url` and the dashboard's links put the name in the query (`urlquery`, Grafana's
    `percentencode`): each name, a dot segment or one that differs from another by a space and a plus too, leads to
    its own page."""
    asked: list[str] = []
    pages = SimpleNamespace(find=lambda wanted: asked.append(wanted))
    app = make_app(CollectorRegistry(), SimpleNamespace(servers=list), "/metrics", None, pages)  # type: ignore[arg-type]
    for escaped in (quote_plus(name, safe=""), quote(name, safe="")):
        assert app(parse_head(f"GET /servers/?name={escaped} HTTP/1.1\r\nHost: x\r\n\r\n".encode())).status == 404
        assert asked == [name], escaped
        asked.clear()
