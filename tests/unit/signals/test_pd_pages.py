"""A router's view of its workers from its metrics page."""

from __future__ import annotations

from stallwatch.signals.router_page import RouterView, parse_router


def test_a_router_page_gives_each_workers_health_and_its_requests_in_flight() -> None:
    page = (b'sgl_router_worker_health{worker="http://127.0.0.1:30000"} 1\n'
            b'sgl_router_worker_health{worker="http://127.0.0.1:30001"} 0\n'
            b'sgl_router_running_requests{worker="http://127.0.0.1:30000"} 2\n'
            b'sgl_router_running_requests{worker="http://127.0.0.1:30001"} 1\n'
            b'sgl_router_worker_health_other{worker="x"} 1\n')
    assert parse_router(page, "sgl_router_worker_health", ("worker", "worker_url"), "sgl_router_running_requests") == (
        RouterView(True, {"http://127.0.0.1:30000": 1.0, "http://127.0.0.1:30001": 0.0}, 3.0))
