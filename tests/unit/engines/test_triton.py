"""Triton Inference Server (`tritonserver`) with its TensorRT-LLM backend as data: which processes are it, where it
listens and is probed, and what its log lines mean, from a real start (`tests/fixtures/logs/triton-2.42-*`) and its
sources' strings (`engines/triton.py`)."""

from __future__ import annotations

import pytest

from stallwatch.discovery.processes import invocation, role_name
from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from stallwatch.signals.engine_page import NoFigures, parse_page
from support import feeding
from support import transcripts as t
from support.paths import ROOT

TRITON = ENGINES["triton"]


def fed(*texts: str) -> LogInterpreter:
    return feeding.fed("triton", *texts)


def gone(interpreter: LogInterpreter) -> tuple[str, int, bool]:
    """The phase once the process is gone, the fatal events counted and whether it was asked to stop."""
    interpreter.process_gone()
    snap = interpreter.snapshot()
    return snap.phase, snap.events["fatal"], snap.stop_requested


@pytest.mark.parametrize(("argv", "found"), [
    (["/opt/tritonserver/bin/tritonserver", "--model-repository=/models/repo"], True),
    (["tritonserver", "--model-repository", "/models/repo", "--http-port", "9000"], True),
    # The launcher runs itself: the rank it starts (its child, above) is the server.
    (["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver", "--model-repository=/r"],
     False),
    # A Python model's stub, a child of the server (`triton_python_backend_stub`), and a client.
    (["/opt/tritonserver/backends/python/triton_python_backend_stub", "/models/repo/preprocessing/1/model.py"], False),
    (["python3", "-m", "tritonclient.perf_analyzer"], False),
])
def test_tritonserver_is_found_and_its_launcher_stub_and_clients_are_not(argv: list[str], found: bool) -> None:
    assert TRITON.program is not None
    assert (TRITON.program.match(invocation(argv)) is not None) is found


def test_a_python_models_stub_is_the_python_backend_role() -> None:
    stub = ["/opt/tritonserver/backends/python/triton_python_backend_stub", "/models/repo/preprocessing/1/model.py",
            "prefix0_1", "1048576", "1048576", "4734", "/opt/tritonserver/backends/python", "336", "preprocessing_0_0"]
    assert role_name(stub, "triton_python_b", TRITON.role_title) == "python_backend"


def test_it_listens_where_its_http_flags_say_and_is_probed_for_readiness() -> None:
    argv = ["tritonserver", "--model-repository=/models/repo", "--http-port=9000", "--grpc-port=9001"]
    assert TRITON.listen_address(argv) == ("0.0.0.0", 9000)
    assert TRITON.listen_address(["tritonserver", "--model-repository=/r"]) == ("0.0.0.0", 8000)
    assert TRITON.health_path == "/v2/health/ready"


def test_a_real_start_loads_the_engine_allocates_its_kv_cache_and_serves_once_its_ports_open() -> None:
    """Triton 2.42 with one TensorRT-LLM engine (launch_triton_server.py, one rank): each model's load, TensorRT-LLM's
    engine and KV cache lines in between, then serving at `Started HTTPService` only, with no event."""
    interpreter = LogInterpreter(ENGINES["triton"])
    lines = t.triton_healthy().splitlines(keepends=True)
    started = next(i for i, line in enumerate(lines) if "Started HTTPService" in line)
    for line in lines[:started]:
        interpreter.feed(line.encode())
    snap = interpreter.snapshot()
    assert snap.phase != "serving" and {"loading_weights", "allocating_memory"} <= set(snap.timeline)
    for line in lines[started:]:
        interpreter.feed(line.encode())
    snap = interpreter.snapshot()
    assert snap.phase == "serving" and not any(snap.events.values())


def test_its_quoted_lines_since_24_06_read_the_same() -> None:
    """24.06 quotes glog messages as JSON strings (`] "Started HTTPService at 0.0.0.0:8000"`)."""
    quoted = "".join(
        f'I0803 18:43:44.{i:06d} 1525575 {where}] "{message}"\n' for i, (where, message) in enumerate((
            ("model_lifecycle.cc:473", "loading: tensorrt_llm:1"),
            ("model_lifecycle.cc:849", "successfully loaded 'tensorrt_llm'"),
            ("grpc_server.cc:2579", "Started GRPCInferenceService at 0.0.0.0:8001"),
            ("http_server.cc:4961", "Started HTTPService at 0.0.0.0:8000"))))
    assert fed(quoted).snapshot().timeline[-2:] == ("loading_weights", "serving")


def test_a_stop_on_sigterm_is_stopped_and_a_crash_or_a_server_not_created_failed() -> None:
    """`Signal (15) received.` and the unload that follows end stopped on request, with no fatal. The counter-tests:
    `Signal (11) received.` (a crash in the executor), `error: creating server: ...` after the same unload sequence
    with no signal line (`--exit-on-error`), and a rank that died under mpirun are failures."""
    assert gone(fed(t.triton_healthy(), t.triton_stop())) == ("stopped", 0, True)
    assert gone(fed(t.triton_healthy(), t.triton_segfault()))[:2] == ("failed", 1)
    assert gone(fed(t.real("triton-24.x-trtllm-backend-missing-failed-to-load-all-models.log")))[::2] == (
        "failed", False)
    mpirun = ("-" * 74 + "\nmpirun noticed that process rank 0 with PID 4734 on node gpu-node-7 exited on signal 11 "
              "(Segmentation fault).\n" + "-" * 74 + "\n")
    assert gone(fed(t.triton_healthy(), mpirun))[:2] == ("failed", 1)


def test_a_model_that_failed_to_load_on_a_server_that_goes_on_is_a_fatal_event_only() -> None:
    """Without `--exit-on-error` Triton serves the models that loaded: the failed one counts, the server serves."""
    failed = ("E0120 08:28:09.425599 2049 model_lifecycle.cc:654] \"failed to load 'tensorrt_llm' version 1: Invalid "
              "argument: unable to find backend library for backend 'tensorrtllm'\"\n")
    lines = t.triton_healthy().splitlines(keepends=True)
    served = fed("".join(lines[:5]), failed, "".join(lines[5:]))
    assert served.snapshot().phase == "serving" and served.snapshot().events["fatal"] == 1


# tensorrtllm_backend README.md at c2e65b88 ("Triton Metrics", lines 699-739): `curl localhost:8002/metrics` of an
# inflight batcher model, verbatim; and the core's families as Triton
# writes them for every backend (core `src/metrics.cc`).
TRT_LLM_PAGE = (ROOT / "tests" / "fixtures" / "pages" / "triton-trtllm-readme.prom").read_text()
CORE_PAGE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="resnet50",version="1"} 12
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="resnet50",version="1"} 0
"""


def test_its_figures_are_the_executors_scheduled_and_waiting_requests_and_its_iterations() -> None:
    """Running is `scheduled`, waiting `waiting` (the backend's active less scheduled: never `max`, `context`, nor
    `active` which counts the waiting again), and the iteration counter stands in for the tokens it does not count;
    each read from its own label value of one family (issue 28)."""
    spec = TRITON.metrics
    assert spec is not None
    assert parse_page(TRT_LLM_PAGE, spec) == (1.0, 1.0, 0.0)
    busy = TRT_LLM_PAGE.replace('request_type="scheduled",version="1"} 1', 'request_type="scheduled",version="1"} 8')
    busy = busy.replace('"iteration_counter",model="tensorrt_llm",version="1"} 0', '"iteration_counter",'
                        'model="tensorrt_llm",version="1"} 6189')
    assert parse_page(busy, spec) == (8.0, 1.0, 6189.0)


def test_a_page_of_other_backends_has_no_figures_and_says_so() -> None:
    """Triton's metrics serve every backend: a page without `nv_trt_llm_*` (an ONNX or Python model) is no page of
    figures (`may_lack_figures`), told apart from one that lacks only some of them (a failing page)."""
    spec = TRITON.metrics
    assert spec is not None and spec.may_lack_figures
    with pytest.raises(NoFigures):
        parse_page(CORE_PAGE, spec)
    partial = "\n".join(line for line in TRT_LLM_PAGE.splitlines() if "iteration_counter" not in line)
    with pytest.raises(ValueError, match="iteration_counter") as raised:
        parse_page(partial, spec)
    assert not isinstance(raised.value, NoFigures)


@pytest.mark.parametrize(("args", "served", "port"), [
    ((), True, 8002),
    (("--metrics-port", "9002"), True, 9002),
    (("--metrics-port=9102", "--allow-metrics=true"), True, 9102),
    (("--allow-metrics=false",), False, 8002),
    (("--allow-metrics", "OFF"), False, 8002),
    (("--allow-metrics=0",), False, 8002),
    (("--metrics-port", "99999"), True, 8002),  # not a port: the default
])
def test_its_metrics_are_on_their_own_port_unless_turned_off(args: tuple[str, ...], served: bool, port: int) -> None:
    """`command_line_parser.cc`: `--metrics-port` (8002), `--allow-metrics` a boolean (`true|on|1`, `false|off|0`,
    any case: `ParseOption<bool>`), in either flag form."""
    spec = TRITON.metrics
    assert spec is not None
    argv = ["tritonserver", "--model-repository=/models/repo", *args]
    assert (spec.served(argv), spec.port(argv)) == (served, port)
