"""The engine's own metrics page: parsed, summed over ranks, capped, and hostile pages refused."""

from __future__ import annotations

import math
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.engines import ENGINES
from stallwatch.signals.engine_page import MAX_SAMPLES, MonotonicCounter, parse_page
from stallwatch.signals.probes import fetch


@pytest.fixture
def page_server() -> Iterator[Callable[[bytes], str]]:
    servers: list[ThreadingHTTPServer] = []

    def serve(body: bytes) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def _bomb(samples: int) -> str:
    spec = ENGINES["vllm"].metrics
    assert spec is not None
    return ("# TYPE vllm:num_requests_running gauge\n"
            + "".join(f'{spec.running}{{engine="{i}"}} 1\n' for i in range(samples))
            + f"{spec.waiting} 0\n{spec.tokens} 5\n")


def _reference(page: str, names: tuple[str, ...], same_over: tuple[str, ...]) -> list[float]:
    """The sums as prometheus_client's parser reads the page (the previous implementation)."""
    groups: dict[str, dict[tuple, float]] = {name: {} for name in names}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in groups and not math.isnan(sample.value):
                key = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in same_over))
                found = groups[sample.name]
                found[key] = max(found.get(key, sample.value), sample.value)
    return [sum(groups[name].values()) for name in names]


def test_a_page_without_the_families_is_an_error() -> None:
    spec = ENGINES["vllm"].metrics
    assert spec is not None
    with pytest.raises(ValueError, match="vllm:num_requests_running"):
        parse_page("# TYPE other gauge\nother 1\n", spec)


def test_counter_keeps_what_an_engine_counted_before_its_restart() -> None:
    counter = MonotonicCounter()
    assert counter.update(100.0, "a") == 100.0
    assert counter.update(150.0, "a") == 150.0
    assert counter.update(10.0, "a") == 160.0  # restarted between fetches: the value dropped
    assert counter.update(500.0, "b") == 660.0  # a new process that already counted past the old value
    assert counter.update(510.0, "b") == 670.0


def test_fetch_caps_the_body(page_server: Callable[[bytes], str]) -> None:
    result, body = fetch(page_server(b"x" * 1000), 2.0, 1000)
    assert result.success and body == b"x" * 1000
    result, body = fetch(page_server(b"x" * 1001), 2.0, 1000)
    assert result.success and body is None


def test_a_page_with_values_that_are_not_finite_is_refused() -> None:
    from stallwatch.engines import ENGINES
    from stallwatch.signals.engine_page import parse_page

    spec = ENGINES["vllm"].metrics
    assert spec is not None
    page = (f"# TYPE {spec.running} gauge\n{spec.running} +Inf\n# TYPE {spec.waiting} gauge\n{spec.waiting} 0\n"
            f"# TYPE {spec.tokens} counter\n{spec.tokens} 12\n")
    with pytest.raises(ValueError, match="not finite"):
        parse_page(page, spec)


def test_a_page_bomb_of_tiny_series_is_a_failed_fetch_and_costs_little() -> None:
    """A 4 MiB page of 95,574 samples cost about 45 MiB to parse, and its sum was exported."""
    spec = ENGINES["vllm"].metrics
    assert spec is not None
    assert parse_page(_bomb(MAX_SAMPLES), spec) == (MAX_SAMPLES, 0.0, 5.0)
    page = _bomb(95_574).encode()
    tracemalloc.start()
    with pytest.raises(ValueError, match=f"more than {MAX_SAMPLES} samples of vllm:num_requests_running"):
        parse_page(page, spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MiB"


def test_page_sums_are_those_of_the_prometheus_parser() -> None:
    """The line-by-line summing that replaced prometheus_client's parser, which cost about 45 MiB per fetch of a 4
    MiB page bomb (docs/research/audit-2026-12-01.md #9), must not read an engine's page otherwise. On escaped help
    text and labels, timestamps, NaN, another family with the same prefix and a trailing comma its sums equal the
    parser's, and a malformed sample line is refused."""
    spec = ENGINES["sglang"].metrics
    assert spec is not None
    names = (spec.running, spec.waiting, spec.tokens)
    page = (f"# HELP {spec.running} Running requests, with a \\\\ and a \\n.\n# TYPE {spec.running} gauge\n"
            f'{spec.running}{{dp_rank="0",tp_rank="0",model="a \\"q\\" }} b"}} 3\n'
            f'{spec.running}{{dp_rank="0",tp_rank="1",model="a \\"q\\" }} b"}} 3\n'
            f'{spec.running}{{dp_rank="1",tp_rank="0",model="c,d=e"}} 2 1700000000000\n'
            f'{spec.running}{{dp_rank="2",tp_rank="0"}} NaN\n'
            f"{spec.running}_other_family 99\n"
            f"# TYPE {spec.waiting} gauge\n{spec.waiting} 1.5e0\n{spec.waiting}{{dp_rank=\"1\",}} +4\n"
            f"# TYPE sglang:generation_tokens counter\n{spec.tokens}{{dp_rank=\"0\"}} 100\n"
            f"{spec.tokens}{{dp_rank=\"1\"}} 2.5e2\nsglang:generation_tokens_created 1.7e9\n")
    expected = _reference(page, names, spec.same_over)
    assert expected == [5.0, 5.5, 350.0]
    assert list(parse_page(page, spec)) == expected
    with pytest.raises(ValueError, match="not a sample"):
        parse_page(page + f"{spec.tokens}{{dp_rank=\"2\" 7\n", spec)
