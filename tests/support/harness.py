"""Test harness: the exporter, simulated engines and fake GPUs as real processes on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.collectors import REGISTRY
from support.paths import FAKES, SIM_BIN, SIM_PKGS

T = TypeVar("T")

GIB = 2**30
# A command's prefix that runs it as `nobody`: another user's process beside the exporter.
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def require(binary: str) -> str:
    """The path of `binary`; the test fails (not skips) without it: the README's test command installs it."""
    path = shutil.which(binary)
    if path is None:
        pytest.fail(f"{binary} is not installed; the README's test command installs it")
    return path


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, never one handed out before in this run: a stalled engine does not bind its port,
    so the kernel would offer it again to the next caller (an exporter then listened on the engine's port)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


# A deadline is room for a loaded machine, never a speed figure: a test that passes meets its condition long before
# it, and one that fails waits this many times what a quiet machine needs (the suite holds beside other work, at a
# load of 5 on 2 cores). The figures themselves are the benchmarks' (tests/bench/).
LOADED_MACHINE = 3


def poll(check: Callable[[], T], timeout: float = 10.0, interval: float = 0.05, what: str = "condition") -> T:
    """Call `check` until it returns something truthy, or fail after `timeout` seconds on a quiet machine
    (LOADED_MACHINE times that on the clock)."""
    timeout *= LOADED_MACHINE
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        # psutil.Error: a child that ended while a process's children were read (a launcher's, gone a moment later)
        except (AssertionError, OSError, KeyError, ValueError, psutil.Error) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def gpus(count: int = 8, used: float = 76e9, util: int = 0, **extra: object) -> list[dict]:
    return [
        {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-5f1c2d3e-0000-4000-8000-{i:012d}",
         "total": 80 * GIB, "used": used, "util": util, **extra}
        for i in range(count)
    ]


class FakeNvml:
    """The scenario file read by tests/support/fakes/pynvml.py; `update` rewrites it atomically."""

    def __init__(self, path: Path, scenario: dict) -> None:
        self.path = path
        self.scenario = scenario
        self.update()

    def update(self, **changes: object) -> None:
        self.scenario.update(changes)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.scenario))
        os.replace(tmp, self.path)


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, name: str) -> list:
        return [s for f in self.families.values() for s in f.samples if s.name == name]

    def value(self, metric: str, /, **labels: str) -> float | None:
        for s in self.samples(metric):
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None

    def labelsets(self, name: str) -> list[dict[str, str]]:
        return [s.labels for s in self.samples(name)]

    def probe(self, metric: str, /, server: str, url: str, **labels: str) -> float | None:
        """`metric` of the server's probe that gets `url` (its `probe_info`); None when no probe gets it."""
        return self._of("probe", "url", metric, server, url, labels)

    def log(self, metric: str, /, server: str, path: str, **labels: str) -> float | None:
        """`metric` of the server's log at `path` (its `log_info`); None when no log of the server is there."""
        return self._of("log", "path", metric, server, path, labels)

    def _of(self, kind: str, where: str, metric: str, server: str, at: str, labels: dict[str, str]) -> float | None:
        names = [ls[kind] for ls in self.labelsets(f"stallwatch_{kind}_info")
                 if ls["server"] == server and ls[where] == at]
        return self.value(metric, server=server, **{kind: names[0]}, **labels) if names else None

    def phase(self, server: str) -> str | None:
        """The server's current startup phase, None when it has none."""
        return next((s.labels["phase"] for s in self.samples("stallwatch_startup_phase")
                     if s.labels.get("server") == server and s.value == 1), None)


class Exporter:
    def __init__(self, tmp: Path, config: str | None = None, nvml: dict | None = None,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None, listen_host: str = "127.0.0.1",
                 ready: bool = True, prefix: list[str] | None = None, url_host: str = "127.0.0.1",
                 details: bool = True) -> None:
        """`listen_host` "" listens on every address (dual-stack); `ready=False` does not wait for `/-/healthy`
        to answer 200 (TLS or basic auth: the test waits its own way). `prefix` runs it elsewhere (a node's
        namespaces, `cluster.Node.prefix`), reached at `url_host`. `details`: every collector's detail families
        too (`--collector.<name>.details`), which tests read as evidence; the golden scrapes run without them, as
        the exporter's defaults are."""
        self.port = free_port()
        self.url = f"http://{url_host}:{self.port}"
        self.nvml = FakeNvml(tmp / "nvml.json", nvml if nvml is not None else {"missing": True})
        cmd = [*(prefix or []), sys.executable, "-m", "stallwatch", f"--web.listen-address={listen_host}:{self.port}",
               *(f"--collector.{r.name}.details" for r in REGISTRY if details), *args]
        if config is not None:
            path = tmp / "stallwatch.yml"
            path.write_text(config)
            cmd.append(f"--config.file={path}")
        env = dict(os.environ, PYTHONPATH=f"{FAKES}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   STALLWATCH_FAKE_NVML=str(self.nvml.path), **(env or {}))
        self.log = tmp / "exporter.log"
        with open(self.log, "wb") as stderr:
            self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        if ready:
            poll(lambda: self.get("/-/healthy")[0] == 200 or self._died(), what="exporter to listen")

    def _died(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"exporter exited {self.proc.returncode}: {self.log.read_text()}")
        return False

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def scrape(self) -> Scrape:
        status, body = self.get("/metrics")
        assert status == 200, body
        return Scrape(body)

    def wait_for(self, check: Callable[[Scrape], T], timeout: float = 15.0, what: str = "metric") -> T:
        return poll(lambda: check(self.scrape()), timeout=timeout, interval=0.2, what=what)

    def seen(self, server: str, log: Path) -> str:
        """What the exporter reads of `server` and the end of its log: what a failure message needs to say why."""
        lines = [line for line in self.scrape().text.splitlines() if f'"{server}"' in line and not line.startswith("#")]
        return f"the log: {log.read_text()[-600:]!r}\nthe exporter: {lines}"

    def wait_stopped_on_request(self, server: str, log: Path) -> None:
        """Until the server reads `stopped` with its stop request read (the reason a clean stop must not page), told
        apart from a page for another cause by what the exporter read."""
        try:
            self.wait_for(lambda s: s.value("stallwatch_startup_phase", server=server, phase="stopped") == 1
                          and s.value("stallwatch_server_stop_requested", server=server) == 1,
                          timeout=30, what=f"{server} stopped on request")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.seen(server, log)}") from exc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


ENGINE_COMMANDS = {
    "sglang": [sys.executable, "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2-Instruct"],
    "vllm": [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "meta-llama/Llama-3.1-70B"],
    "llamacpp": [str(SIM_BIN / "llama-server"), "-m", "/models/qwen2.5-7b-instruct-q4_k_m.gguf"],
    "tgi": [str(SIM_BIN / "text-generation-launcher"), "--model-id", "bigscience/bloom-560m"],
    "trtllm": [str(SIM_BIN / "trtllm-serve"), "serve", "meta-llama/Llama-3.1-8B-Instruct"],
    "triton": [str(SIM_BIN / "tritonserver"), "--model-repository=/models/triton_model_repo_llama3",
               "--disable-auto-complete-config"],
    "lmdeploy": [str(SIM_BIN / "lmdeploy"), "serve", "api_server", "internlm/internlm3-8b-instruct", "--backend",
                 "pytorch"],
    # Run by this interpreter, as a console script's shebang runs it: its titled children need setproctitle.
    "aphrodite-vllm": [sys.executable, str(SIM_BIN / "aphrodite"), "run", "PygmalionAI/Eleusis-12B"],
    # Its port is DYN_SYSTEM_PORT's (the `env` of `Engine`), not a flag: the `--port` the harness adds is the
    # simulator's alone. Without a port it is named after its model: the test gives `--model` in `args`.
    "dynamo-vllm": [sys.executable, "-m", "dynamo.vllm"],
    "dynamo-sglang": [sys.executable, "-m", "dynamo.sglang"],
    "dynamo-trtllm": [sys.executable, "-m", "dynamo.trtllm"],
    # Xinference's worker, which matches no engine: its model process, a child titled `Model: <uid>` (the scenario's
    # `children`), is the server.
    "xinference": [sys.executable, str(SIM_BIN / "xinference-local"), "--host", "127.0.0.1"],
    "sglang_router": [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"],
    "vllm_proxy": [sys.executable, str(SIM_BIN / "toy_proxy_server.py")],
}


def mpirun(ranks: int = 1) -> list[str]:
    """A command's prefix that runs it as `ranks` ranks under the simulated Open MPI launcher, as TensorRT-LLM's
    Triton launcher does (`launch_triton_server.py --world_size=N`)."""
    return [str(SIM_BIN / "mpirun"), "--allow-run-as-root", "-n", str(ranks)]


MPIRUN = mpirun()
PORT_FLAGS = {"lmdeploy": "--server-port", "triton": "--http-port"}  # where the engine's port flag is not `--port`
METRICS_PORT_FLAGS = {"triton": "--metrics-port"}  # the metrics page's own port, where it has one


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to a process started in a session of its own and everything it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Engine:
    """A simulated engine process (tests/sim/pkgs/enginesim.py) with stdout and stderr in `log`."""

    def __init__(self, tmp: Path, engine: str, transcript: str, final: str = "stall", tp: int = 8,
                 port: int | None = None, burn_child_seconds: float = 0.0, load_http: str = "refuse",
                 line_delay: float = 0.0, log_name: str | None = None, prefix: list[str] | None = None,
                 args: tuple[str, ...] = (), work: dict | None = None, on_sigterm: str | None = None,
                 supervise: dict | None = None, children: list[str] | None = None, http: str = "api",
                 env: dict[str, str] | None = None, shell: str | None = None, dies: dict | None = None,
                 live_work: bool = False) -> None:
        """`work`: the engine's own view once serving (requests, throughput, its `/metrics`; see enginesim).
        `on_sigterm`: what it logs when asked to stop. `supervise`: run it under tests/sim/bin/restart-always
        with these settings (`restart_sec`, `max_restarts`), restarted each time it exits. `children` (titles) and
        `http` (`api`, `dummy`, `none`): a worker node's processes and port (see enginesim). `env`: more of its
        environment (a LeaderWorkerSet's `LWS_*`). `shell`: started as `sh -c '<shell>; exec <the command>'`, as
        container entrypoints do. `dies`: `{"after": s, "transcript": text, "health": 503}`, its engine dies behind
        its live HTTP server that long after it began serving (see enginesim). `live_work`: `work` is read from a file
        that `update_work` rewrites, so the test moves the engine on while it runs (a transfer that stops)."""
        self.port = port or free_port()
        self.log = tmp / (log_name or f"{engine}-{self.port}.log")
        stem = tmp / f"{engine}-{self.port}"
        transcript_path = stem.with_suffix(".transcript")
        transcript_path.write_text(transcript)
        scenario = stem.with_suffix(".json")
        extra: dict[str, object] = {"work": work} if work is not None else {}
        self._work_file: Path | None = None
        if live_work:
            self._work_file = stem.with_suffix(".work.json")
            self._work = dict(work or {})
            self._work_file.write_text(json.dumps(self._work))
            extra["work_file"] = str(self._work_file)
        if on_sigterm is not None:
            stop_path = stem.with_suffix(".on-sigterm")
            stop_path.write_text(on_sigterm)
            extra["on_sigterm"] = str(stop_path)
        if dies is not None:
            death_path = stem.with_suffix(".dies")
            death_path.write_text(dies["transcript"])
            extra["dies"] = {**dies, "transcript": str(death_path)}
        scenario.write_text(json.dumps({
            "transcript": str(transcript_path), "final": final, "burn_child_seconds": burn_child_seconds,
            "load_http": load_http, "line_delay": line_delay, "children": children, "http": http, **extra,
        }))
        env = dict(os.environ, **(env or {}), ENGINESIM_SCENARIO=str(scenario),
                   PYTHONPATH=f"{SIM_PKGS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        # `prefix` runs it elsewhere, e.g. `ip netns exec NAME` (which execs: the pid stays the engine's).
        # `args` come first: the exporter reads a flag's first value (`--port ²`), the simulator's argparse the
        # last (the real port it binds).
        cmd = [*(prefix or []), *ENGINE_COMMANDS[engine], *args, PORT_FLAGS.get(engine, "--port"), str(self.port),
               "--tp", str(tp)]
        if engine in METRICS_PORT_FLAGS:  # never the engine's default: other tests' engines run beside it
            cmd += [METRICS_PORT_FLAGS[engine], str(free_port())]
        if shell is not None:
            cmd = ["sh", "-c", f"{shell}; exec {shlex.join(cmd)}"]
        if supervise is not None:
            spec = stem.with_suffix(".supervise.json")
            spec.write_text(json.dumps({**supervise, "argv": cmd}))
            cmd = [str(SIM_BIN / "restart-always"), str(spec)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.name = f"{engine}-{self.port}"

    def update_work(self, **changes: object) -> None:
        """What a `live_work` engine reports from now on (its counters go on from where they are)."""
        assert self._work_file is not None, "started without live_work"
        self._work.update(changes)
        tmp = self._work_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._work))
        os.replace(tmp, self._work_file)

    def terminate(self) -> None:
        """SIGTERM to the main process only, as Kubernetes and Docker stop a container's PID 1."""
        self.proc.terminate()
        self.proc.wait(10)

    def stop(self) -> None:
        kill_group(self.proc)


class Ollama:
    """A simulated `ollama serve` (tests/sim/bin/ollama) on a free port given in `OLLAMA_HOST`, with stdout and stderr
    in `log`: it runs `steps` (see the simulator), each load's runner the simulated llama-server with
    `runner_transcript`, then in the state `runner_final` (enginesim's `serve` or `stall`) with `runner_work`
    (enginesim's work: `{"metrics": "hang"}` is a runner whose main loop froze, its `/slots` never answered)."""

    def __init__(self, tmp: Path, steps: list[list[object]], runner_transcript: str,
                 runner_final: str = "serve", runner_work: dict | None = None) -> None:
        self.port = free_port()
        tmp = tmp / f"ollama-{self.port}"  # a folder each: several in one test
        tmp.mkdir()
        transcript = tmp / "ollama-runner.transcript"
        transcript.write_text(runner_transcript)
        runner = tmp / "ollama-runner.json"
        work = {"work": runner_work} if runner_work is not None else {}
        runner.write_text(json.dumps({"transcript": str(transcript), "final": runner_final, **work}))
        scenario = tmp / "ollama.json"
        scenario.write_text(json.dumps({"runner_scenario": str(runner), "steps": steps}))
        self.log = tmp / "ollama.log"
        self.name = f"ollama-{self.port}"
        env = dict(os.environ, OLLAMA_SIM_SCENARIO=str(scenario), OLLAMA_HOST=f"127.0.0.1:{self.port}")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(SIM_BIN / "ollama"), "serve"], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def runner_ports(self) -> list[str]:
        """The ports of the runners it started so far, from its `starting llama-server` lines."""
        lines = [line for line in self.log.read_text().splitlines() if 'msg="starting llama-server"' in line]
        return [line.split(" --port ", 1)[1].split()[0] for line in lines]

    def stop(self) -> None:
        kill_group(self.proc)


DIAGNOSE_STALE = "defaults:\n  stall:\n    log_stale: 1s\n"  # the stall counts after 1 s of silence, not 10 minutes


def diagnose(tmp: Path, *args: str, config: str | None = DIAGNOSE_STALE, nvml: dict | None = None,
             ) -> subprocess.CompletedProcess[str]:
    """`stallwatch diagnose ARGS --window=1` as a process, with the fake NVML in `nvml`."""
    fake = FakeNvml(tmp / "diagnose-nvml.json", nvml if nvml is not None else {"missing": True})
    flags = []
    if config is not None:
        path = tmp / "diagnose.yml"
        path.write_text(config)
        flags.append(f"--config.file={path}")
    env = dict(os.environ, PYTHONPATH=f"{FAKES}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               STALLWATCH_FAKE_NVML=str(fake.path))
    return subprocess.run([sys.executable, "-m", "stallwatch", *flags, "diagnose", *args, "--window=1"],
                          capture_output=True, text=True, env=env, timeout=60)
