"""A simulated inference engine: the real process shape, log lines and HTTP behaviour, no model.

Started with the real engine's command line (`python -m sglang.launch_server --port N --tp 8`, with
tests/sim/pkgs on PYTHONPATH), it spawns children titled like the engine's own (`sglang::scheduler_TP3`,
`VLLM::Worker_TP1`), writes a transcript of real log lines to stdout, keeps its port closed while
"loading" (as SGLang and vLLM do) and then ends in the scenario's final state:

    stall  port stays closed, every process asleep (the silent stall)
    serve  /health answers 200; nothing more is logged (a healthy server without traffic)
    hang   the port accepts connections but never answers
    crash  exits with status 1
    segfault  dies of SIGSEGV

The scenario is JSON in the file named by ENGINESIM_SCENARIO:
    {"transcript": "path", "line_delay": 0.0, "final": "stall", "load_http": "refuse" | "503",
     "burn_child_seconds": 0.0, "work": {...}, "on_sigterm": "path", "children": [titles], "http": "api",
     "dies": {"after": 1.0, "transcript": "path", "health": 503}}

`children`: the children's titles instead of the engine's single-node set (a worker node of a multi-node
deployment: SGLang's `sglang::scheduler_TP8`.. without a detokenizer, vLLM's `VLLM::EngineCore_DP1`).
`http` once serving: `api` the engine's own port; `dummy` SGLang's node_rank >= 1 health server (`srt/utils/
common.py`: 200 on `/health`, `/health_generate` and `/ping` whatever happens, FastAPI's 404 elsewhere); `none` no
port at all (a vLLM `--headless` node).

`dies` (with `final: serve`): the engine dies behind its live HTTP server `after` seconds of serving (TensorRT-LLM's
executor under MPI): it logs that transcript, and `/health` answers `health` from then on (503 with the engine's
words, `UNAVAILABLE`), the rest of its pages as before; with `"final": "segfault"` the whole process dies of it then.

`on_sigterm`: what the engine logs when it is asked to stop (SGLang's `SIGTERM received ... Draining requests`),
written before it exits; without it a SIGTERM ends it silently.

`work` (with `final: serve`) is the engine's own view once serving: `/metrics` in the engine's real format and
its periodic stats lines (see `Work`), at the engine's path (`PAGE_PATHS`) beside its JSON pages (`JSON_PAGES`):
    {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 0, "ranks": 1, "interval": 0.5,
     "metrics": "serve" | "hang" | "off", "pad_bytes": 0}
throughput 0 with requests running is the post-ready hang (vLLM #23378): `/health` 200, the counter frozen.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHILD_TITLES = {
    "sglang": lambda tp: [f"sglang::scheduler_TP{i}" if tp > 1 else "sglang::scheduler" for i in range(tp)]
    + ["sglang::detokenizer"],
    "vllm": lambda tp: ["VLLM::EngineCore"] + ([f"VLLM::Worker_TP{i}" for i in range(tp)] if tp > 1 else []),
    "llamacpp": lambda tp: [],
    "tgi": lambda tp: [f"text-generation-server serve bigscience/bloom-560m --uds-path /tmp/text-generation-server-{i}"
                       for i in range(tp)] + ["text-generation-router --port 3000"],
    "trtllm": lambda tp: [],  # its MPI workers set no title
    "triton": lambda tp: [],  # TensorRT-LLM's executor runs in the server's process (one rank)
    # The PyTorch engine's process, renamed by `prctl(PR_SET_NAME)` alone (`mp_engine/zmq_engine.py:107-112`).
    "lmdeploy": lambda tp: ["comm:ZMQMPEngine"],
    # vLLM's titles under Aphrodite's prefix (`utils/system_utils.py` `set_process_title`).
    "aphrodite-vllm": lambda tp: ["APHRODITE::EngineCore"] + ([f"APHRODITE::Worker_TP{i}" for i in range(tp)]
                                                             if tp > 1 else []),
}
CHILD_TITLES["dynamo-vllm"] = CHILD_TITLES["vllm"]  # vLLM's engine in the worker's process
CHILD_TITLES["dynamo-sglang"] = CHILD_TITLES["sglang"]  # SGLang's `sgl.Engine` in the worker's process
CHILD_TITLES["dynamo-trtllm"] = CHILD_TITLES["trtllm"]  # TensorRT-LLM's LLM in the worker's process
# Engines launched once per rank of which only rank 0 serves, and the variable that gives the rank: Triton's
# TensorRT-LLM ranks above 0 never return from their model instance's init (`model_instance_state.cc:844-856`): no
# line, no port, the process asleep in the executor's loop.
RANK_ENV = {"triton": "OMPI_COMM_WORLD_RANK"}
COMM_ONLY = "comm:"  # a title set as the process's `comm` only, its command line left as it was


def wait_for_draft_hidden_states(parent: int | None = None) -> None:
    """Where every process of the simulated engine sleeps, named after the seeds' stall (the draft model waiting
    on hidden states it never got) so that a stack dump shows a recognisable frame: until the parent is gone
    (a child), or for good (the main process)."""
    while parent is None or os.getppid() == parent:
        time.sleep(0.2 if parent is not None else 3600)


def _exit_with_parent(parent: int) -> None:
    wait_for_draft_hidden_states(parent)
    os._exit(0)


def child(title: str, parent: int, burn_seconds: float) -> None:
    if title.startswith(COMM_ONLY):
        import ctypes

        ctypes.CDLL(None).prctl(15, title[len(COMM_ONLY):].encode(), 0, 0, 0)  # PR_SET_NAME, as LMDeploy does
    else:
        import setproctitle

        setproctitle.setproctitle(title)
    if burn_seconds:
        end = time.process_time() + burn_seconds
        while time.process_time() < end:
            pass
        return  # a child that exits mid-run
    _exit_with_parent(parent)


class Work:
    """What a serving engine reports about its work: requests split over `ranks` (DP engines, SGLang DP groups)
    and a generated-tokens counter growing at `throughput` tokens/s from when serving began. A PD member
    (`role` from its `--disaggregation-mode` or `kv_role`) reports its requests `pending` by stage and a counter of
    KV transfers completed growing at `transfers_rate` a second. With `work_file`, the spec is read again from that
    file whenever it changes (a test moves the engine on: a transfer that stops), the counters going on from where
    they were."""

    def __init__(self, engine: str, spec: dict, role: str = "", work_file: str | None = None) -> None:
        self.engine, self.role, self.work_file = engine, role, work_file
        self._spec, self._stamp = spec, None
        self.ranks = int(spec.get("ranks", 1))
        self._lock = threading.Lock()
        self._at = time.monotonic()
        self._tokens = float(spec.get("tokens_start", 0))
        self._transfers = float(spec.get("transfers_start", 0))

    @property
    def spec(self) -> dict:
        if self.work_file is not None:
            try:
                stamp = os.stat(self.work_file).st_mtime_ns
                if stamp != self._stamp:
                    with open(self.work_file) as handle:
                        spec = json.load(handle)
                    self._advance()  # what the old rates made until now
                    self._spec, self._stamp = spec, stamp
            except (OSError, ValueError):
                pass
        return self._spec

    def _advance(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens += float(self._spec.get("throughput", 0.0)) * (now - self._at)
            self._transfers += float(self._spec.get("transfers_rate", 0.0)) * (now - self._at)
            self._at = now

    def split(self, key: str) -> list[float]:
        total = float(self.spec.get(key, 0))
        return [total / self.ranks] * self.ranks

    def tokens(self) -> list[float]:
        self.spec  # noqa: B018 (a changed spec first)
        self._advance()
        return [int(self._tokens) / self.ranks] * self.ranks

    def transfers(self) -> float:
        self.spec  # noqa: B018
        self._advance()
        return float(int(self._transfers))

    def pending(self, stage: str) -> float:
        return float(self.spec.get("pending", {}).get(stage, 0))

    def page(self) -> bytes:
        out = PAGES[self.engine](self)
        pad = int(self.spec.get("pad_bytes", 0))
        if pad:  # a big page: histograms of other families come first, as on a real vLLM page
            filler = '# TYPE filler_seconds histogram\n'
            line = 'filler_seconds_bucket{le="%d",model_name="meta-llama/Llama-3.1-70B"} 0\n'
            filler += "".join(line % i for i in range(pad // len(line % 1000) + 1))
            out = filler + out
        return out.encode()

    def stats_lines(self) -> str:
        if self.engine not in STATS_LINES or not (self.spec.get("running") or self.spec.get("waiting")):
            return ""  # idle: vLLM logs its stats at DEBUG, SGLang logs no batch (nor while it only waits on KV)
        clock = time.strftime("%H:%M:%S")
        rows = zip(self.split("running"), self.split("waiting"), self.split("throughput"), strict=True)
        if self.role in PD_STATS_LINES.get(self.engine, {}):
            line = PD_STATS_LINES[self.engine][self.role]
            return "".join(line(clock, rank, int(running), int(waiting), throughput, self.ranks, self)
                           for rank, (running, waiting, throughput) in enumerate(rows))
        return "".join(STATS_LINES[self.engine](clock, rank, int(running), int(waiting), throughput, self.ranks)
                       for rank, (running, waiting, throughput) in enumerate(rows))


def _series(name: str, kind: str, help_text: str, rows: list[tuple[str, float]]) -> str:
    out = f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
    return out + "".join(f"{name}{labels} {value}\n" for labels, value in rows)


def _per_engine_page(work: Work, prefix: str, model: str) -> str:
    """vLLM's families as its PrometheusStatLogger writes them (`vllm/v1/metrics/loggers.py`: labels `engine`, one
    per DP engine, and `model_name`), under `prefix`; LMDeploy's (`lmdeploy/metrics/loggers.py`) are the same."""
    labels = [f'{{engine="{i}",model_name="{model}"}}' for i in range(work.ranks)]
    return (_series(f"{prefix}num_requests_running", "gauge", "Number of requests in model execution batches.",
                    list(zip(labels, work.split("running"), strict=True)))
            + _series(f"{prefix}num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                      list(zip(labels, work.split("waiting"), strict=True)))
            + _series(f"{prefix}generation_tokens_total", "counter", "Number of generation tokens processed.",
                      list(zip(labels, work.tokens(), strict=True)))
            + "".join(f"{prefix}generation_tokens_created{label} 1.7635e+09\n" for label in labels))


def _vllm_page(work: Work) -> str:
    """With a KV role, a consumer's fetches by stage (`v1/metrics/loggers.py:571-591`) and NIXL's transfer-time
    histogram, whose count is the transfers completed (`kv_connector/v1/nixl/stats.py:188-276`)."""
    model = "meta-llama/Llama-3.1-70B"
    page = _per_engine_page(work, "vllm:", model)
    if work.role == "decode" or "pending" in work.spec:
        page += _series("vllm:num_requests_kv_fetch_by_stage", "gauge", "Number of requests in each KV fetch stage.",
                        [(f'{{engine="0",model_name="{model}",stage="{stage}"}}', work.pending(pending))
                         for stage, pending in VLLM_KV_FETCH_STAGES])
    if work.role:
        page += ("# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.\n"
                 "# TYPE vllm:nixl_xfer_time_seconds histogram\n"
                 f'vllm:nixl_xfer_time_seconds_bucket{{engine="0",le="+Inf",model_name="{model}"}} '
                 f"{work.transfers()}\n"
                 f'vllm:nixl_xfer_time_seconds_count{{engine="0",model_name="{model}"}} {work.transfers()}\n'
                 f'vllm:nixl_xfer_time_seconds_sum{{engine="0",model_name="{model}"}} {work.transfers() * 0.02}\n')
    return page


# vLLM's KV fetch stages and the work spec's `pending` stage each is read as (stallwatch/engines/vllm.py).
VLLM_KV_FETCH_STAGES = (("waiting_to_start", "prealloc"), ("in_progress", "transfer"), ("completed_waiting", ""))


# SGLang's PD queues and transfer histogram (`srt/observability/metrics_collector.py:582-604,637-699`), with the
# `engine_type` label of a PD server (`srt/disaggregation/utils.py:150-161`).
SGLANG_PD_SERIES = (
    ("sglang:num_prefill_bootstrap_queue_reqs", "bootstrap", "The number of requests in the prefill bootstrap queue."),
    ("sglang:num_prefill_inflight_queue_reqs", "inflight", "The number of requests in the prefill inflight queue."),
    ("sglang:num_decode_prealloc_queue_reqs", "prealloc", "The number of requests in the decode prealloc queue."),
    ("sglang:num_decode_transfer_queue_reqs", "transfer", "The number of requests in the decode transfer queue."),
)


def _sglang_page(work: Work) -> str:
    """`srt/observability/metrics_collector.py`: every TP rank of a DP group repeating its figures (as with
    `--enable-metrics-for-all-schedulers`)."""
    engine_type = work.role or "unified"

    def rows(values: list[float]) -> list[tuple[str, float]]:
        return [(f'{{dp_rank="{dp}",engine_type="{engine_type}",model_name="moonshotai/Kimi-K2-Instruct",pp_rank="0",'
                 f'tp_rank="{tp}"}}', value) for dp, value in enumerate(values) for tp in range(2)]
    page = (_series("sglang:num_running_reqs", "gauge", "The number of running requests.", rows(work.split("running")))
            + _series("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                      rows(work.split("waiting")))
            + _series("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                      rows(work.tokens())))
    if work.role or "pending" in work.spec:
        for name, stage, help_text in SGLANG_PD_SERIES:
            page += _series(name, "gauge", help_text, rows([work.pending(stage) / work.ranks] * work.ranks))
        count = work.transfers()
        page += ("# HELP sglang:kv_transfer_latency_ms The latency of KV transfer in ms.\n"
                 "# TYPE sglang:kv_transfer_latency_ms histogram\n"
                 + "".join(f"sglang:kv_transfer_latency_ms_bucket{labels[:-1]},le=\"+Inf\"}} {value}\n"
                           f"sglang:kv_transfer_latency_ms_count{labels} {value}\n"
                           f"sglang:kv_transfer_latency_ms_sum{labels} {value * 12.5}\n"
                           for labels, value in rows([count / work.ranks] * work.ranks)))
    return page


def _tgi_page(work: Work) -> str:
    tokens = sum(work.tokens())
    return ("# TYPE tgi_batch_current_size gauge\n" f"tgi_batch_current_size {sum(work.split('running'))}\n"
            "# TYPE tgi_queue_size gauge\n" f"tgi_queue_size {sum(work.split('waiting'))}\n"
            "# TYPE tgi_request_generated_tokens histogram\n"
            'tgi_request_generated_tokens_bucket{le="1"} 0\n'
            f'tgi_request_generated_tokens_bucket{{le="+Inf"}} {int(tokens // 100)}\n'
            f"tgi_request_generated_tokens_sum {tokens}\n"
            f"tgi_request_generated_tokens_count {int(tokens // 100)}\n")


def _llamacpp_page(work: Work) -> str:
    """`tools/server/server.cpp` metrics handler."""
    return (_series("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
                    [("", sum(work.tokens()))])
            + _series("llamacpp:requests_processing", "gauge", "Number of requests processing.",
                      [("", sum(work.split("running")))])
            + _series("llamacpp:requests_deferred", "gauge", "Number of requests deferred.",
                      [("", sum(work.split("waiting")))]))


def _trtllm_page(work: Work) -> str:
    """`tensorrt_llm/metrics/collector.py` through `/prometheus/metrics` (labels `model_name`, `engine_type`)."""
    labels = '{engine_type="undefined",model_name="undefined"}'
    return (_series("trtllm_num_requests_running", "gauge", "Number of requests currently running.",
                    [(labels, sum(work.split("running")))])
            + _series("trtllm_num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                      [(labels, sum(work.split("waiting")))])
            + _series("trtllm_generation_tokens_total", "counter", "Number of generation tokens processed.",
                      [(labels, sum(work.tokens()))]))


def _trtllm_iteration_stats(work: Work) -> bytes:
    """`openai_server.py` `get_iteration_stats` at `/metrics`: the executor's iteration stats as JSON, numbers that
    are not the text format's (a reader that took them as samples would count these)."""
    return json.dumps([{"iter": 1187, "iterLatencyMS": 21.4, "gpuMemUsage": 68719476736,
                        "numActiveRequests": sum(work.split("running")) + 1000,
                        "numQueuedRequests": sum(work.split("waiting")) + 1000,
                        "trtllm_generation_tokens_total": 99999999}]).encode()


def _triton_page(work: Work) -> str:
    """Triton's metrics port with the TensorRT-LLM backend's families (`custom_metrics_reporter.cc`, the backend's
    README example): the executor's iteration counter moves with the work's tokens. With `metrics: core` the page of
    a model of another backend: Triton's own families only."""
    labels = 'model="tensorrt_llm",version="1"'
    core = _series("nv_inference_request_success", "counter", "Number of successful inference requests, all batch "
                   "sizes", [(f"{{{labels}}}", 12)])
    if work.spec.get("metrics") == "core":
        return core
    running, waiting = sum(work.split("running")), sum(work.split("waiting"))
    return (core + _series("nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics",
                           [(f'{{{labels},request_type="{kind}"}}', value) for kind, value in
                            (("waiting", waiting), ("context", 0), ("scheduled", running), ("max", 512),
                             ("active", running + waiting))])
            + _series("nv_trt_llm_general_metrics", "gauge", "General TRT LLM metrics",
                      [(f'{{general_type="iteration_counter",{labels}}}', sum(work.tokens())),
                       (f'{{general_type="timestamp",{labels}}}', int(time.time()))]))


def _lmdeploy_page(work: Work) -> str:
    return _per_engine_page(work, "lmdeploy:", "internlm/internlm3-8b-instruct")


def _aphrodite_page(work: Work) -> str:
    """vLLM's page under Aphrodite's prefix (`v1/metrics/loggers.py:479-501,659`)."""
    return _per_engine_page(work, "aphrodite:", "PygmalionAI/Eleusis-12B")


PAGES = {"vllm": _vllm_page, "sglang": _sglang_page, "tgi": _tgi_page, "llamacpp": _llamacpp_page,
         "trtllm": _trtllm_page, "triton": _triton_page, "lmdeploy": _lmdeploy_page, "aphrodite-vllm": _aphrodite_page,
         "dynamo-vllm": _vllm_page}  # a Dynamo worker's system port re-exports vLLM's families
PAGE_PATHS = {"trtllm": "/prometheus/metrics"}  # the text format's page where it is not `/metrics`
METRICS_PORT = {"triton": "--metrics-port"}  # the page on a port of its own, given by this flag, not on the engine's
def _llamacpp_slots(work: Work) -> bytes:
    """llama-server's `/slots` (on by default): one object per slot as `server_slot::to_json` writes it, the loop's
    answer to a SERVER_TASK_TYPE_METRICS task (so it hangs with the loop, `metrics: hang`)."""
    running = sum(work.split("running"))
    return json.dumps([{"id": slot, "id_task": 7 if slot < running else -1, "n_ctx": 4096, "speculative": False,
                        "is_processing": slot < running,
                        "next_token": {"has_next_token": slot < running, "has_new_line": False, "n_remain": -1,
                                       "n_decoded": 12 if slot < running else 0, "stopping_word": ""}}
                       for slot in range(max(1, running))]).encode()


JSON_PAGES = {"trtllm": {"/metrics": _trtllm_iteration_stats}, "llamacpp": {"/slots": _llamacpp_slots}}
# `/health` once the engine died behind its HTTP server (`openai_server.py` `health`).
UNAVAILABLE = {"trtllm": b"LLM is unavailable. Please check the server logs for more details.",
               # `serve/core/async_engine.py` `_validate_scheduler_progress` through `/health` (`management.py`).
               "lmdeploy": b'{"status":"unhealthy","message":"Backend scheduler_tick has not advanced for 95.3s."}'}
HEALTHY = {"lmdeploy": b'{"status":"healthy","message":"Engine is healthy."}'}  # `/health`'s 200 where not the default


def _vllm_stats(clock: str, rank: int, running: int, waiting: int, throughput: float, ranks: int) -> str:
    return (f"(APIServer pid={os.getpid()}) INFO 11-20 {clock} [loggers.py:276] Engine {rank:03d}: Avg prompt "
            f"throughput: 0.0 tokens/s, Avg generation throughput: {throughput:.1f} tokens/s, Running: {running} "
            f"reqs, Waiting: {waiting} reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 0.0%\n")


def _sglang_stats(clock: str, rank: int, running: int, waiting: int, throughput: float, ranks: int) -> str:
    prefix = f"DP{rank} TP0" if ranks > 1 else "TP0"
    return (f"[2026-11-20 {clock} {prefix}] Decode batch, #running-req: {running}, #token: 4096, token usage: "
            f"0.03, cuda graph: True, gen throughput (token/s): {throughput:.2f}, #queue-req: {waiting}\n")


def _lmdeploy_stats(clock: str, rank: int, running: int, waiting: int, throughput: float, ranks: int) -> str:
    """`lmdeploy/metrics/loggers.py:97-127`, printed (no logger prefix)."""
    return (f"[2026-11-20 {clock} DP{rank}] Avg thr (in/out): 35.2 / {throughput:.1f} tokens/s, Server "
            f"(succeeded/failed/routed/waiting): 120 / 0 / {running} / {waiting}, Engine (running/waiting): "
            f"{running} / {waiting}, KV cache: 12.5%, \n")


def _aphrodite_stats(clock: str, rank: int, running: int, waiting: int, throughput: float, ranks: int) -> str:
    """vLLM's stats line in Aphrodite's default format (`logger.py` `_FORMAT_INFO`)."""
    return (f"INFO 11-20 {clock} Engine {rank:03d}: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
            f"{throughput:.1f} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: 12.5%, "
            "Prefix cache hit rate: 0.0%\n")


STATS_LINES = {"vllm": _vllm_stats, "sglang": _sglang_stats, "lmdeploy": _lmdeploy_stats,
               "aphrodite-vllm": _aphrodite_stats}


# A PD server's batch line after its `[time TP0] ` prefix (`metrics_reporter.py:766-772` prefill,
# `:1023-1043` decode): its PD queues beside running and waiting.
SGLANG_PD_BATCH = {
    "prefill": ("Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.05, #running-req: "
                "{running}, #queue-req: {waiting}, #pending-token: 0, #bootstrap-req: {bootstrap}, #inflight-req: "
                "{inflight}, #optimistic-req: 0, cuda graph: False, input throughput (token/s): 4096.00"),
    "decode": ("Decode batch, #running-req: {running}, #token: 4096, token usage: 0.03, pre-allocated usage: 0.01, "
               "#prealloc-req: {prealloc}, #transfer-req: {transfer}, #retracted-req: 0, cuda graph: True, gen "
               "throughput (token/s): {throughput:.2f}, #queue-req: {waiting}"),
}


def _sglang_pd_batch(clock: str, rank: int, running: int, waiting: int, throughput: float, ranks: int,
                     work: Work) -> str:
    prefix = f"DP{rank} TP0" if ranks > 1 else "TP0"
    stages = {stage: int(work.pending(stage)) for stage in ("bootstrap", "inflight", "prealloc", "transfer")}
    line = SGLANG_PD_BATCH[work.role].format(running=running, waiting=waiting, throughput=throughput, **stages)
    return f"[2026-11-20 {clock} {prefix}] {line}\n"


PD_STATS_LINES = {"sglang": {"prefill": _sglang_pd_batch, "decode": _sglang_pd_batch}}


KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode"}
DUMMY_ROUTES = ("/health", "/health_generate", "/ping")


class _Health(BaseHTTPRequestHandler):
    status = 200
    engine = ""
    work: Work | None = None
    dummy = False
    pages = True  # serves the metrics page (the engine's port does not where the page has a port of its own)
    unavailable = b'{"error":{"message":"Loading model","code":503}}'  # the body of a status that is not 200

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if self.dummy and path not in DUMMY_ROUTES:
            self.status = 404
            self._send(b'{"detail":"Not Found"}', "application/json")
            return
        if self.work is not None and path in JSON_PAGES.get(self.work.engine, {}):
            if self.work.spec.get("metrics") == "hang":  # a page its main loop answers: waits with the loop
                time.sleep(3600)
            self.status = 200
            self._send(JSON_PAGES[self.work.engine][path](self.work), "application/json")
            return
        if self.work is not None and path == PAGE_PATHS.get(self.work.engine, "/metrics") and self.pages:
            self._metrics(self.work)
            return
        healthy = HEALTHY.get(self.engine, b'{"status":"ok"}')
        self._send(healthy if self.status == 200 else self.unavailable, "application/json")

    def _metrics(self, work: Work) -> None:
        mode = work.spec.get("metrics", "serve")
        if mode == "hang":  # llama.cpp: the handler waits on a stuck main loop
            time.sleep(3600)
        if mode == "off":
            self.status = 404
            self._send(b"File Not Found", "text/plain")
            return
        self.status = 200
        self._send(work.page(), "text/plain; version=0.0.4; charset=utf-8")

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _http(host: str, port: int, status: int, work: Work | None = None, dummy: bool = False,
          engine: str = "", pages: bool = True) -> ThreadingHTTPServer:
    handler = type("Handler", (_Health,), {"status": status, "work": work, "dummy": dummy, "engine": engine,
                                           "pages": pages})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _dies(spec: dict, http: ThreadingHTTPServer, engine: str) -> None:
    """After `spec["after"]` seconds, the engine's death behind its HTTP server (see `dies` above)."""
    time.sleep(float(spec.get("after", 1.0)))
    handler = http.RequestHandlerClass
    handler.status = int(spec.get("health", 503))  # type: ignore[attr-defined]
    handler.unavailable = UNAVAILABLE.get(engine, handler.unavailable)  # type: ignore[attr-defined]
    with open(spec["transcript"], "rb") as lines:
        sys.stdout.buffer.write(lines.read())
    sys.stdout.buffer.flush()
    if spec.get("final") == "segfault":
        _segfault()


def _segfault() -> None:
    """A native crash: killed by the signal its handler raised again (SIGSEGV's default action; Python installs no
    handler for it, and none can be set outside the main thread)."""
    os.kill(os.getpid(), signal.SIGSEGV)


def _stop(said: str | None) -> None:
    """SIGTERM's handler. It writes to the descriptor, not through `sys.stdout`: the handler runs between two
    bytecodes of the main thread, which may be inside that buffer's own write (a stats line), and a reentrant
    write raises there instead of logging the stop."""
    if said:
        with open(said, "rb") as lines:
            data = lines.read()
        while data:
            data = data[os.write(sys.stdout.fileno(), data):]
    os._exit(0)


def main(engine: str) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", "--hostname", default="127.0.0.1")
    # The last one given wins; only it must be a number (LMDeploy's is `--server-port`, Triton's `--http-port`).
    parser.add_argument("--port", "--server-port", "--http-port", dest="port", required=True)
    parser.add_argument("--tp", "--tp-size", "--tensor-parallel-size", "--num-shard", "--tp_size", dest="tp", type=int,
                        default=1)
    parser.add_argument("--disaggregation-mode", default="")
    parser.add_argument("--kv-transfer-config", default="{}")  # vLLM's: `kv_role` kv_producer or kv_consumer
    parser.add_argument(METRICS_PORT.get(engine, "--no-metrics-port"), dest="metrics_port", type=int)
    args, _ = parser.parse_known_args()
    args.port = int(args.port)
    with open(os.environ["ENGINESIM_SCENARIO"]) as handle:
        scenario = json.load(handle)
    if int(os.environ.get(RANK_ENV.get(engine, ""), "0")) > 0:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while True:
            time.sleep(3600)
    signal.signal(signal.SIGTERM, lambda *_: _stop(scenario.get("on_sigterm")))

    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=child, args=(title, os.getpid(), 0.0), daemon=True)
                for title in scenario.get("children") or CHILD_TITLES[engine](args.tp)]
    burn = float(scenario.get("burn_child_seconds", 0.0))
    if burn:
        children.append(context.Process(target=child, args=(f"{engine}::short_lived", os.getpid(), burn)))
    for proc in children:
        proc.start()

    loading = _http(args.host, args.port, 503) if scenario.get("load_http") == "503" else None
    delay = float(scenario.get("line_delay", 0.0))
    with open(scenario["transcript"], "rb") as transcript:
        for line in transcript.read().splitlines(keepends=True):
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            if delay:
                time.sleep(delay)
    if loading is not None:
        loading.shutdown()
        loading.server_close()

    final = scenario.get("final", "stall")
    if final == "crash":
        os._exit(1)
    if final == "segfault":
        _segfault()
    if final == "serve":
        kv_role = json.loads(args.kv_transfer_config).get("kv_role")
        role = (args.disaggregation_mode if args.disaggregation_mode in ("prefill", "decode")
                else KV_ROLES.get(kv_role, ""))
        work = Work(engine, scenario["work"], role, scenario.get("work_file")) if "work" in scenario else None
        http = scenario.get("http", "api")
        if http != "none":
            server = _http(args.host, args.port, 200, work, dummy=http == "dummy", engine=engine,
                           pages=engine not in METRICS_PORT)
            if engine in METRICS_PORT and args.metrics_port:
                _http(args.host, args.metrics_port, 200, work, engine=engine)
            if "dies" in scenario:
                threading.Thread(target=_dies, args=(scenario["dies"], server, engine), daemon=True).start()
        while work is not None:
            sys.stdout.write(work.stats_lines())
            sys.stdout.flush()
            time.sleep(float(work.spec.get("interval", 0.5)))
    elif final == "hang":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((args.host, args.port))
        listener.listen(64)  # accepted by the kernel, never answered
    wait_for_draft_hidden_states()


class RouterView:
    """A simulated SGLang PD router's own view (sgl-router `src/metrics.rs@584506b`): each worker's health from its
    `/health`, checked every `interval` seconds (the real router: every 60 s, a 5 s timeout), and its requests in
    flight from the work spec's `running` (a `work_file` moves it on)."""

    def __init__(self, workers: list[str], work: Work, interval: float) -> None:
        self.workers, self.work, self.interval = workers, work, interval
        self.health = dict.fromkeys(workers, 0.0)
        threading.Thread(target=self._check, daemon=True).start()

    def _check(self) -> None:
        import urllib.request

        while True:
            for url in self.workers:
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                        self.health[url] = 1.0 if response.status == 200 else 0.0
                except OSError:
                    self.health[url] = 0.0
            time.sleep(self.interval)

    def page(self) -> bytes:
        running = float(self.work.spec.get("running", 0))
        share = running / max(len(self.workers), 1)
        return (_series("sgl_router_worker_health", "gauge", "Worker health status (1=healthy, 0=unhealthy)",
                        [(f'{{worker="{url}"}}', value) for url, value in self.health.items()])
                + _series("sgl_router_running_requests", "gauge", "Number of running requests per worker",
                          [(f'{{worker="{url}"}}', share) for url in self.workers])
                + _series("sgl_router_active_workers", "gauge", "Number of active workers",
                          [("", sum(self.health.values()))])).encode()


def router_main() -> None:
    """`python -m sglang_router.launch_router --pd-disaggregation --prefill URL [PORT] --decode URL`: it retitles
    itself `sglang::router` (`launch_router.py:32`), logs its start (the scenario's transcript), answers `/health`
    with a constant 200 (as the mini_lb does) and serves its metrics on `--prometheus-port` (29000)."""
    import setproctitle

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--prometheus-port", type=int, default=29000)
    parser.add_argument("--prefill", nargs="+", action="append", default=[])
    parser.add_argument("--decode", action="append", default=[])
    args, _ = parser.parse_known_args()
    with open(os.environ["ENGINESIM_SCENARIO"]) as handle:
        scenario = json.load(handle)
    setproctitle.setproctitle("sglang::router")
    with open(scenario["transcript"], "rb") as transcript:
        sys.stdout.buffer.write(transcript.read())
    sys.stdout.buffer.flush()
    work = Work("router", scenario.get("work", {}), work_file=scenario.get("work_file"))
    view = RouterView([urls[0] for urls in args.prefill] + args.decode, work,
                      float(scenario.get("health_interval", 1.0)))
    _http(args.host, args.port, 200)

    class Metrics(_Health):
        def do_GET(self) -> None:
            self.status = 200
            self._send(view.page(), "text/plain; version=0.0.4; charset=utf-8")

    metrics = ThreadingHTTPServer(("0.0.0.0", args.prometheus_port), Metrics)
    metrics.daemon_threads = True
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    wait_for_draft_hidden_states()


def toy_proxy_main() -> None:
    """`python toy_proxy_server.py --port 8000 --prefiller-hosts H.. --prefiller-ports P.. --decoder-hosts ..
    --decoder-ports ..`, vLLM's disaggregated-prefill proxy (`tests/v1/kv_connector/nixl_integration/
    toy_proxy_server.py@030ea52`): it logs its start (the scenario's transcript) and answers `/healthcheck` with a
    constant 200. It has no metrics page."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()
    with open(os.environ["ENGINESIM_SCENARIO"]) as handle:
        scenario = json.load(handle)
    with open(scenario["transcript"], "rb") as transcript:
        sys.stdout.buffer.write(transcript.read())
    sys.stdout.buffer.flush()
    _http(args.host, args.port, 200)
    wait_for_draft_hidden_states()
