"""LMDeploy's `lmdeploy serve api_server` as data: which processes are it, where it listens, what its log lines
mean, its `lmdeploy:*` page and stats line as the engine's figures, and its `/health` 503 message as the probe's
reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stallwatch.discovery.processes import invocation
from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.logs.stats_lines import last_stats
from stallwatch.report.observe import probe_info
from stallwatch.signals.engine_page import parse_page
from stallwatch.signals.probes import probe, said
from support import feeding
from support import transcripts as t
from support.sim import enginesim

LMDEPLOY = ENGINES["lmdeploy"]


def fed(*texts: str, interpreter: LogInterpreter | None = None) -> LogInterpreter:
    return feeding.fed("lmdeploy", *texts, interpreter=interpreter)


@pytest.mark.parametrize(("argv", "found"), [
    (["/opt/py3/bin/lmdeploy", "serve", "api_server", "internlm/internlm3-8b-instruct"], True),
    (["/usr/bin/python3", "/opt/py3/bin/lmdeploy", "serve", "api_server", "/models/qwen", "--backend", "pytorch"],
     True),
    (["python3", "-m", "lmdeploy", "serve", "api_server", "/models/qwen"], True),
    (["python3", "-m", "lmdeploy.serve.openai.api_server", "/models/qwen"], True),
    # The router and the other front-ends hold no model.
    (["lmdeploy", "serve", "proxy", "--server-port", "8000"], False),
    (["lmdeploy", "serve", "gradio", "/models/qwen"], False),
    (["lmdeploy", "chat", "/models/qwen"], False),
])
def test_the_api_server_is_found_and_the_proxy_is_not(argv: list[str], found: bool) -> None:
    assert LMDEPLOY.program is not None
    assert (LMDEPLOY.program.match(invocation(argv)) is not None) is found


@pytest.mark.parametrize(("argv", "address", "model", "tp"), [
    (["lmdeploy", "serve", "api_server", "internlm/internlm3-8b-instruct"], ("0.0.0.0", 23333),
     "internlm/internlm3-8b-instruct", ""),
    (["lmdeploy", "serve", "api_server", "/models/Qwen3-32B", "--server-name", "127.0.0.1", "--server-port", "8080",
      "--tp", "4"], ("127.0.0.1", 8080), "/models/Qwen3-32B", "4"),
])
def test_address_model_and_tensor_parallel_from_the_command_line(argv: list[str], address: tuple[str, int],
                                                                 model: str, tp: str) -> None:
    assert LMDEPLOY.listen_address(argv) == address
    assert LMDEPLOY.model(argv) == model
    assert LMDEPLOY.tensor_parallel(argv) == tp


def test_a_healthy_start_goes_through_the_phases_without_a_fatal() -> None:
    assert feeding.phase_steps("lmdeploy", t.lmdeploy_healthy()) == [
        "launching", "loading_weights", "allocating_memory", "warming_up", "serving"]
    snap = fed(t.lmdeploy_healthy()).snapshot()
    assert (snap.shards_loaded, snap.shards_expected) == (4, 4)
    assert snap.events["fatal"] == 0 and snap.launches == 1


def test_at_the_default_log_level_the_bar_the_hints_and_uvicorn_still_say_the_phases() -> None:
    """`--log-level WARNING` (the default) prints none of its logger's INFO lines."""
    weights = fed(t.lmdeploy_until_weights(files=8, upto=5, info=False)).snapshot()
    assert weights.phase == "loading_weights" and (weights.shards_loaded, weights.shards_expected) == (5, 8)
    assert fed(t.lmdeploy_healthy(info=False)).snapshot().phase == "serving"


def test_a_frozen_weights_bar_is_loading_weights_where_it_stopped() -> None:
    snap = fed(t.lmdeploy_until_weights(files=8, upto=3)).snapshot()
    assert snap.phase == "loading_weights" and (snap.shards_loaded, snap.shards_expected) == (3, 8)


@pytest.mark.parametrize("death", [
    t.lmdeploy_engine_died(),
    "2026-11-20 10:02:41,412 - lmdeploy - ERROR - engine_loop.py:639 - EngineLoop wait_tasks failed.\n",
    "2026-11-20 10:02:41,412 - lmdeploy - ERROR - zmq_rpc.py:62 - PyTorch ZMQ engine process is not alive.\n",
    "[TM][FATAL][1120 10:02:41.412345][LlamaBatch.cc:1024] CUDA runtime error: an illegal memory access\n",
])
def test_the_engines_death_behind_the_api_server_is_failed(death: str) -> None:
    snap = fed(t.lmdeploy_healthy(), death).snapshot()
    assert snap.phase == "failed" and snap.events["fatal"] >= 1


def test_a_stop_ends_stopped_and_says_it_was_asked() -> None:
    interpreter = fed(t.lmdeploy_healthy(), t.lmdeploy_stop())
    assert interpreter.snapshot().stop_requested
    interpreter.process_gone()
    snap = interpreter.snapshot()
    assert snap.phase == "stopped" and snap.events["fatal"] == 0


def test_its_page_is_the_engines_figures_unless_turned_off() -> None:
    spec = LMDEPLOY.metrics
    assert spec is not None and spec.path == "/metrics"
    work = enginesim.Work("lmdeploy", {"running": 4, "waiting": 2, "tokens_start": 7000, "ranks": 2})
    assert parse_page(work.page(), spec) == (4.0, 2.0, 7000.0)
    assert spec.served(["lmdeploy", "serve", "api_server", "m"])
    assert not spec.served(["lmdeploy", "serve", "api_server", "m", "--disable-metrics"])


def test_its_stats_line_gives_running_waiting_and_throughput_per_dp_rank() -> None:
    stats = LMDEPLOY.stats_lines[0]
    lines = "".join(enginesim._lmdeploy_stats("10:00:0" + str(i), rank, 3 + i, rank, 120.5, 2)
                    for i in range(3) for rank in range(2))
    assert last_stats(lines.encode(), stats) == {b"": (5, 0, 120.5), b"1": (5, 1, 120.5)}  # rank 0 as b""
    assert fed(t.lmdeploy_healthy(info=False), lines).snapshot().phase == "serving"


STALLED = b'{"status":"unhealthy","message":"Backend scheduler_tick has not advanced for 95.3s."}'


@pytest.mark.parametrize(("body", "words"), [
    (STALLED, "Backend scheduler_tick has not advanced for 95.3s."),
    (b'{"status":"unhealthy","message":"No successful health probe for 91.2s."}',
     "No successful health probe for 91.2s."),
    (b'{"status":"unhealthy","message":"a\\u001b[2Jb' + b"x" * 300 + b'"}', "a\\x1b[2Jb" + "x" * 191),
    (b'{"detail":"Not Found"}', ""),
    (b'["message"]', ""),
    (b"Internal Server Error", ""),
])
def test_the_health_message_is_the_engines_words_made_safe(body: bytes, words: str) -> None:
    assert said(body, "message") == words


class _Unhealthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = STALLED if self.path == "/health" else b'{"status":"healthy","message":"Engine is healthy."}'
        self.send_response(503 if self.path == "/health" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def unhealthy() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unhealthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_503_with_its_message_is_the_probes_reason(unhealthy: int) -> None:
    """The stalled scheduler's 503: the reason class stays `http_status` (the counter's label), the report says why
    in LMDeploy's words; a probe without the engine's key, or one that passes, has none."""
    result = probe(f"http://127.0.0.1:{unhealthy}/health", 2.0, LMDEPLOY.health_message)
    assert (result.success, result.status, result.reason) == (False, 503, "http_status")
    assert probe_info("u", result, "").reason == "http_status: Backend scheduler_tick has not advanced for 95.3s."
    assert probe(f"http://127.0.0.1:{unhealthy}/health", 2.0).detail == ""
    assert probe(f"http://127.0.0.1:{unhealthy}/other", 2.0, "message").detail == ""
