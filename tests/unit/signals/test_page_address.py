"""Where a server's own pages are fetched: the health probe's address with the page's path, and its own port where the
page has one (Triton's metrics service)."""

from __future__ import annotations

import pytest

from stallwatch.config import Config, Probe, ServerSpec
from stallwatch.discovery.server import Server
from stallwatch.signals.page_address import page_url


@pytest.mark.parametrize(("health", "port", "page"), [
    ("http://127.0.0.1:8000/v2/health/ready", None, "http://127.0.0.1:8000/metrics"),
    ("http://127.0.0.1:8000/v2/health/ready?verbose=1", 8002, "http://127.0.0.1:8002/metrics"),
    ("http://[fd00::5]:8000/v2/health/ready", 8002, "http://[fd00::5]:8002/metrics"),
    ("https://triton.example:8443/v2/health/ready", 9002, "https://triton.example:9002/metrics"),
])
def test_a_page_is_at_the_probes_address_on_its_own_port_if_it_has_one(health: str, port: int | None,
                                                                        page: str) -> None:
    server = Server("triton", ServerSpec(engine="triton", probes=(Probe(url=health),)), Config())
    assert page_url(server, "/metrics", port) == (page, False)
