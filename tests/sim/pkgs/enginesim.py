"""A simulated inference engine: the real process shape, log lines and HTTP behaviour, no model.

Started with the real engine's command line (`python -m sglang.launch_server --port N --tp 8`, with
tests/sim/pkgs on PYTHONPATH), it spawns children titled like the engine's own (`sglang::scheduler_TP3`,
`VLLM::Worker_TP1`), writes a transcript of real log lines to stdout, keeps its port closed while
"loading" (as SGLang and vLLM do) and then ends in the scenario's final state:

    stall  port stays closed, every process asleep (the silent stall)
    serve  /health answers 200; nothing more is logged (a healthy server without traffic)
    hang   the port accepts connections but never answers
    crash  exits with status 1

The scenario is JSON in the file named by ENGINESIM_SCENARIO:
    {"transcript": "path", "line_delay": 0.0, "final": "stall", "load_http": "refuse" | "503",
     "burn_child_seconds": 0.0}
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
}


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def child(title: str, parent: int, burn_seconds: float) -> None:
    import setproctitle

    setproctitle.setproctitle(title)
    if burn_seconds:
        end = time.process_time() + burn_seconds
        while time.process_time() < end:
            pass
        return  # a child that exits mid-run
    _exit_with_parent(parent)


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = b'{"status":"ok"}' if self.status == 200 else b'{"error":{"message":"Loading model","code":503}}'
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _http(host: str, port: int, status: int) -> ThreadingHTTPServer:
    handler = type("Handler", (_Health,), {"status": status})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(engine: str) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", "--hostname", default="127.0.0.1")
    parser.add_argument("--port", required=True)  # the last one given wins; only it must be a number
    parser.add_argument("--tp", "--tp-size", "--tensor-parallel-size", dest="tp", type=int, default=1)
    args, _ = parser.parse_known_args()
    args.port = int(args.port)
    with open(os.environ["ENGINESIM_SCENARIO"]) as handle:
        scenario = json.load(handle)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=child, args=(title, os.getpid(), 0.0), daemon=True)
                for title in CHILD_TITLES[engine](args.tp)]
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
    if final == "serve":
        _http(args.host, args.port, 200)
    elif final == "hang":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((args.host, args.port))
        listener.listen(64)  # accepted by the kernel, never answered
    while True:
        time.sleep(3600)
