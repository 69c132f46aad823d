"""What an engine is, as data: how to find its main process, its port and health URL, how to name its
children, which log lines move the startup phase or count as events, and where its own figures are."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple
from urllib.parse import urlsplit

PHASES = (
    "stopped",
    "launching",
    "loading_weights",
    "allocating_memory",
    "capturing_graphs",
    "warming_up",
    "serving",
    "failed",
)
EVENTS = ("fatal", "nccl_timeout", "oom", "stall_warning", "server_restart", "kv_transfer_failure")
PD_ROLES = ("prefill", "decode")
# Where a request of a prefill/decode (PD) disaggregated deployment waits outside running and waiting: a prefill
# server's `bootstrap` (for the decode side's handshake) and `inflight` (prefilled, KV being sent), a decode
# server's `prealloc` (for KV memory) and `transfer` (for the KV data).
PENDING_STAGES = ("bootstrap", "inflight", "prealloc", "transfer")


@dataclass(frozen=True)
class Rule:
    """A log pattern (bytes regex, matched after ANSI codes are stripped) and what a match means."""

    pattern: re.Pattern[bytes]
    phase: str | None = None
    event: str | None = None
    # The engine's own launch banner, printed once per launch: a new launch (a restart after the first), and where
    # a restarted exporter replays a log from. Other `launching` lines (a speculative draft model's second
    # distributed init) only start a launch when none was seen.
    launch: bool = False
    # The engine says it was asked to stop (SIGTERM): the failure lines that follow in this launch are its own
    # shutdown (SGLang's children "crashed with exit code -15"), and the process that then exits is stopped.
    stop: bool = False
    # False: one request's error prints this line too (a traceback), so it means something only before serving.
    serving: bool = True
    # The first line of a Python traceback: judged by the exception that ends it (`logs.tracebacks`), a stop or a
    # failure (its `event`).
    traceback: bool = False
    # A failure the engine reports after its stop line, which it prints on every exit (llama.cpp's `exiting due to
    # model loading error` after `cleaning up before exit...`): a failure still.
    after_stop: bool = False
    # A banner that some builds print before the engine's main banner and older ones after it, within the same
    # launch (llama.cpp's `ggml_cuda_init`: at startup since the backends load first, at model load before): after
    # a main banner of this launch it starts no new one.
    second_banner: bool = False
    # A failure of one of the server's runners, which the server outlives (an Ollama model load that fails while the
    # server serves its other models): its event counts, and the launch has not failed for it.
    runner: bool = False
    # One model's load in a server that serves others (Ollama's runner start): `loading_weights` from `serving`,
    # until a line moves it back (the load's ready or failed line); the server's liveness probe (Ollama's `/`, which
    # answers whatever its runners do) does not end it, so a load that stalls reads as one.
    model_load: bool = False


def rule(regex: str, phase: str | None = None, event: str | None = None, *, launch: bool = False,
         stop: bool = False, serving: bool = True, traceback: bool = False, after_stop: bool = False,
         second_banner: bool = False, runner: bool = False, model_load: bool = False) -> Rule:
    if phase is not None and phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    if event is not None and event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    if (launch or second_banner) and phase != "launching":
        raise ValueError("a launch banner is a launching line")
    if runner and phase is not None:
        raise ValueError("a runner's failure moves no phase of the server")
    if model_load and phase != "loading_weights":
        raise ValueError("a model's load is a loading_weights line")
    return Rule(re.compile(regex.encode(), re.MULTILINE), phase, event, launch or second_banner, stop, serving,
                traceback, after_stop, second_banner, runner, model_load)


# Open MPI (mpirun, as TensorRT-LLM, Triton's TensorRT-LLM backend and multi-node llama.cpp run): a rank's signal
# handler (`opal/util/stacktrace.c`) and the launcher's summary when a rank exits non-zero or dies of a signal
# (`orte/.../help-errmgr-base`: `mpirun noticed that process rank 1 with PID 0 on node gpu-7 exited on signal 6
# (Aborted).`).
MPI_RANK_DIED = (r"\*\*\* Process received signal \*\*\*|(?:Primary|Child) job +\d* *terminated normally, but \d+ "
                 r"process(?:es)? returned|(?:mpirun|mpiexec) noticed that process rank \d+ with PID \d+ on node \S+ "
                 r"exited on signal \d+")

# Lines printed by PyTorch, NCCL and Python itself, whatever engine runs on top of them.
COMMON_RULES: tuple[Rule, ...] = (
    rule(r"Watchdog caught collective operation timeout", event="nccl_timeout"),
    rule(r"Heartbeat monitor timed out", event="nccl_timeout"),
    rule(r"ProcessGroupNCCL's watchdog got stuck|This typically indicates a NCCL/CUDA API", event="nccl_timeout"),
    rule(r"Exception \(either an error or timeout\) detected by watchdog", event="nccl_timeout"),
    # Out of memory in each allocator's words: PyTorch's caching allocator (`c10/cuda/CUDACachingAllocator.cpp`:
    # `CUDA out of memory. Tried to allocate`, hipified `HIP out of memory`; `torch.OutOfMemoryError`), the CUDA
    # and HIP runtimes' error string for `cudaErrorMemoryAllocation` (`CUDA error: out of memory`, as
    # `torch.AcceleratorError` or ggml's `ggml_cuda_error` print it, `ROCm error: out of memory` in ggml's HIP
    # build), vLLM's cumem allocator (`csrc/cumem_allocator.cpp`: `CUDA Error: out of memory at <file>:<line>`, a
    # failed `/wake_up`), and cuBLAS's `CUBLAS_STATUS_ALLOC_FAILED`.
    rule(r"(?:CUDA|HIP|ROCm) (?:[Ee]rror: )?out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|"
         r"hipErrorOutOfMemory|CUBLAS_STATUS_ALLOC_FAILED", event="oom"),
    # A traceback is fatal before serving unless it ends in a stop (Ctrl-C's KeyboardInterrupt: `logs.tracebacks`);
    # once serving, one request's error prints one too (the API server keeps serving: vLLM's `serving_chat.py`,
    # SGLang's `serving_base.py` `Error in request:`), and an engine that dies says so in its own words (each
    # engine's rules).
    rule(r"Traceback \(most recent call last\)", event="fatal", serving=False, traceback=True),
    rule(r"terminate called after throwing an instance", event="fatal"),
    rule(MPI_RANK_DIED, event="fatal"),
    # A stop asked of the process from outside: abseil's failure signal handler (Ray's workers, `logging.cc`:
    # `*** SIGTERM received at time=... ***`) and hf-xet's SIGINT handler during a model download from the Hub
    # (huggingface/xet-core `xet_threadpool`: `Cancellation requested; stopping current tasks.`).
    rule(r"\*\*\* SIGTERM received at time=|Cancellation requested; stopping current tasks\.", stop=True),
)

# `Loading safetensors checkpoint shards:  50% Completed | 4/8 [...]`: SGLang and vLLM share the tqdm format
# (`{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [...]`) and name the bar by loader: SGLang's
# `model_loader/weight_utils.py` has `Multi-thread loading shards` (its default loader since 2026-04), `... pt
# checkpoint shards` and `np_cache`; vLLM's eager strategy appends ` (eager)`.
CHECKPOINT_BAR = (rb"(?:Loading (?:safetensors|pt|np_cache) checkpoint shards|Multi-thread loading (?:pt checkpoint )?"
                  rb"shards)(?: \(eager\))?:\s*\d+% Completed \|")
CHECKPOINT_SHARDS = re.compile(CHECKPOINT_BAR + rb" (\d+)/(\d+)")


class Figures(NamedTuple):
    """What an engine reports of its work, from its `/metrics` page or its stats lines."""

    running: float
    waiting: float
    tokens: float  # generated tokens so far (a counter)
    at: float  # when these figures were seen, seconds since the epoch


@dataclass(frozen=True)
class MetricsSpec:
    """How the engine's own `/metrics` page feeds stallwatch's engine families: the sample names (as the text
    format writes them, counters with `_total`) whose values are summed over every label set (ranks, `engine="N"`
    labels), after taking the largest value over the labels in `same_over` (ranks that repeat one figure)."""

    running: str
    waiting: str
    tokens: str
    # Flags of which one must be on the command line for `/metrics` to be served; () when always served.
    needs_flag: tuple[str, ...] = ()
    # Flags any of which turns the page off where it is on by default (LMDeploy's `--disable-metrics`).
    off_flags: tuple[str, ...] = ()
    path: str = "/metrics"
    # HTTP statuses that say the page is not turned on, where what turns it on is not on the command line (a file of
    # options): no page, as without the flag, not a page that fails.
    absent_status: tuple[int, ...] = ()
    same_over: tuple[str, ...] = ()
    # The engine's main loop answers the page itself (llama.cpp posts it as a task and waits): a fetch that times out
    # is a request the loop holds unanswered, while its HTTP threads (and `/health`) may still answer.
    through_loop: bool = False
    # PD disaggregation, read where the page has them (a server that is no PD member has none): requests pending in
    # each stage (`PENDING_STAGES`), a stage's samples by name or `name{label="value"}`, summed as above; and the
    # counters whose sum is the KV transfers completed (a histogram's `_count`).
    pending: tuple[tuple[str, str], ...] = ()
    transfers: tuple[str, ...] = ()
    # The page on a port of its own (Triton's metrics service): a flag that gives it, else `default_port`; None (and
    # no flags): the engine's own port.
    port_flags: tuple[str, ...] = ()
    default_port: int | None = None
    # Flags whose boolean value (`false`, `off`, `0`, any case) turns the page off (Triton's `--allow-metrics`).
    switch_flags: tuple[str, ...] = ()
    # The page serves more than this engine's figures, which a server may lack (Triton's metrics serve every backend;
    # only TensorRT-LLM's models have `nv_trt_llm_*`): a page with none of them is no page, not a failing one.
    may_lack_figures: bool = False

    def served(self, argv: Sequence[str]) -> bool:
        switch = flag_value(argv, self.switch_flags)
        return ((not self.needs_flag or any(arg in self.needs_flag for arg in argv))
                and not any(arg in self.off_flags for arg in argv)
                and (switch is None or switch.lower() not in ("false", "off", "0")))

    def port(self, argv: Sequence[str]) -> int | None:
        """The page's own port; None: the engine's."""
        return port_flag(argv, self.port_flags, self.default_port)


@dataclass(frozen=True)
class LoadedModels:
    """A JSON page of the engine's that lists the models it has loaded and the GPU memory each holds (Ollama's
    `/api/ps`): an object whose `list_key` is a list of objects, each with its name at `name_key` and its bytes of
    GPU memory at `memory_key`."""

    path: str
    list_key: str
    name_key: str
    memory_key: str


@dataclass(frozen=True)
class RunnerLoops:
    """A page that each process of `role` in the server's tree serves through its own main loop, on the port its
    command line gives after `port_flag`, at the server's loopback (Ollama's runners, upstream llama-server on
    `--host 127.0.0.1 --port <random>`: `/slots` is posted to its main loop as a task and waited for, as `/metrics`
    is). A fetch that times out is a runner whose loop holds requests unanswered while the server's own API, and its
    health check, answer (`signals.runner_loops`)."""

    role: str
    path: str
    port_flag: str = "--port"


@dataclass(frozen=True)
class StatsLine:
    """The engine's periodic stats line: `anchor` is a literal every such line contains (found from the end of a
    block with `rfind`), `pattern` matches the line with groups `running`, `waiting`, `throughput` (generated
    tokens/s) and optionally `rank` (a DP engine's own line). `max_interval` caps the seconds one line's throughput
    is integrated over (its averaging window: lines are not printed while idle)."""

    anchor: bytes
    pattern: re.Pattern[bytes]
    max_interval: float = 10.0


@dataclass(frozen=True)
class PendingLine:
    """A log line that gives requests pending in PD stages (SGLang's `#bootstrap-req: N, #inflight-req: M` in its
    prefill batch lines): `anchor` a literal every such line holds, `pattern` with a group per stage it gives (named
    as in `PENDING_STAGES`) and optionally `rank` (a DP group's own line)."""

    anchor: bytes
    pattern: re.Pattern[bytes]
    role: str = ""  # the PD role whose lines these are ("" any): a server looks only for its own role's lines


@dataclass(frozen=True)
class Disaggregation:
    """How a server of a prefill/decode disaggregated deployment says its role on its command line: a flag whose
    value is the role word (`role_values`: word, lower case, to `prefill` | `decode`; others are no role), a flag
    that is the role alone (`--is-prefill-worker`), or a key of a JSON flag (`--kv-transfer-config
    '{"kv_role": ...}'`, also given as `--kv-transfer-config.kv_role ...`)."""

    role_flags: tuple[str, ...] = ()
    role_values: tuple[tuple[str, str], ...] = ()
    prefill_flags: tuple[str, ...] = ()
    decode_flags: tuple[str, ...] = ()
    json_flags: tuple[str, ...] = ()
    json_key: str = ""
    # Flags that make a server a PD member whose role only its router's lists give (vLLM's `--kv-transfer-config`
    # with `kv_both`, which NixlConnector ignores: the proxy's `--prefiller-hosts`/`--decoder-hosts` fix the roles).
    member_flags: tuple[str, ...] = ()

    def member(self, argv: Sequence[str]) -> bool:
        return any(arg in self.member_flags or arg.startswith(tuple(f"{f}=" for f in self.member_flags))
                   or arg.startswith(tuple(f"{f}." for f in self.member_flags)) for arg in argv)

    def role(self, argv: Sequence[str]) -> str:
        """`prefill`, `decode`, or "" when the command line names neither."""
        words = dict(self.role_values)
        word = flag_value(argv, self.role_flags)
        if word is not None and words.get(word.lower()):
            return words[word.lower()]
        if any(arg in self.prefill_flags for arg in argv):
            return "prefill"
        if any(arg in self.decode_flags for arg in argv):
            return "decode"
        if self.json_key:
            word = flag_value(argv, tuple(f"{flag}.{self.json_key}" for flag in self.json_flags))
            if word is None:
                word = _json_key(flag_value(argv, self.json_flags), self.json_key)
            return words.get(word.lower(), "") if word else ""
        return ""


@dataclass(frozen=True)
class HostList:
    """A router's flags that list the servers of one role as hosts and ports that pair up in order (the vLLM toy
    proxy's `--prefiller-hosts a b --prefiller-ports 8100 8101`), one port for every host when only one is given,
    the router's defaults when neither is."""

    role: str
    host_flags: tuple[str, ...]
    port_flags: tuple[str, ...]
    default_host: str
    default_port: int

    def members(self, argv: Sequence[str]) -> list[tuple[str, str, int]]:
        hosts = flag_list(argv, self.host_flags) or [self.default_host]
        ports = [whole_number(p) for p in flag_list(argv, self.port_flags)] or [self.default_port]
        if len(ports) == 1:
            ports = ports * len(hosts)
        return [(self.role, host, port) for host, port in zip(hosts, ports, strict=False) if port]


@dataclass(frozen=True)
class Router:
    """A PD router's command line and its own view. `member_flags` (flag, role) each take a worker URL and, for a
    prefill, an optional bootstrap port after it (`--prefill http://P:30000 8998 --decode http://D:30001`), and
    repeat; `host_lists` list hosts and ports. Its metrics page is on a port of its own (`metrics_port_flags`, else
    `metrics_default_port`; none with a `no_metrics_flags` flag): `worker_health` 1/0 per worker (its label among
    `worker_labels`) is its view of its workers, `running` its requests in flight."""

    member_flags: tuple[tuple[str, str], ...] = ()
    host_lists: tuple[HostList, ...] = ()
    metrics_port_flags: tuple[str, ...] = ()
    metrics_default_port: int | None = None
    no_metrics_flags: tuple[str, ...] = ()
    worker_health: str = ""
    worker_labels: tuple[str, ...] = ()
    running: str = ""

    def members(self, argv: Sequence[str]) -> list[tuple[str, str, int]]:
        """(role, host, port) of each server the command line lists, in order."""
        out: list[tuple[str, str, int]] = []
        for flag, role in self.member_flags:
            for value in flag_values(argv, (flag,)):
                host, port = _url_address(value)
                if port is not None:
                    out.append((role, host, port))
        for listed in self.host_lists:
            out += listed.members(argv)
        return out

    def metrics_port(self, argv: Sequence[str]) -> int | None:
        if not self.worker_health or any(arg in self.no_metrics_flags for arg in argv):
            return None
        return port_flag(argv, self.metrics_port_flags, self.metrics_default_port)


def _json_key(text: str | None, key: str) -> str | None:
    """A string value of `key` in a JSON object flag; None when it is not one."""
    if not text or len(text) > 64 * 1024:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


def _url_address(text: str) -> tuple[str, int | None]:
    """Host and port of a worker URL as a router is given it (`http://host:port`, `host:port`)."""
    parts = urlsplit(text if "//" in text else f"//{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None and parts.scheme in ("http", "https"):
        port = 443 if parts.scheme == "https" else 80
    return parts.hostname or "", port


@dataclass(frozen=True)
class Rendezvous:
    """An address every node of one multi-node deployment is given on its command line: `host_flags` name a
    `host:port` value (`--dist-init-addr`), or a host whose port is in `port_flags` (`--master-addr` and
    `--master-port`), defaulting to `default_port`."""

    host_flags: tuple[str, ...]
    port_flags: tuple[str, ...] = ()
    default_port: str = ""


@dataclass(frozen=True)
class MultiNode:
    """How one node of a deployment over several says so on its command line: the node count and this node's rank
    (`nnodes_flags`, `node_rank_flags`), or data-parallel ranks (`dp_*_flags`: the deployment's ranks, this node's
    and its first, whose quotients are the nodes and this node's rank), the rendezvous address that joins the
    nodes, a flag that makes any node a worker (`--headless`), the processes that hold its ranks (by role), and
    the lines that mean something else on a worker than on the head (`worker_rules`, ahead of the engine's)."""

    rendezvous: tuple[Rendezvous, ...]
    rank_role: re.Pattern[str]
    nnodes_flags: tuple[str, ...] = ()
    node_rank_flags: tuple[str, ...] = ()
    dp_size_flags: tuple[str, ...] = ()
    dp_local_flags: tuple[str, ...] = ()
    dp_start_flags: tuple[str, ...] = ()
    headless_flags: tuple[str, ...] = ()
    worker_rules: tuple[Rule, ...] = ()

    def number(self, argv: Sequence[str], flags: Sequence[str]) -> int | None:
        return whole_number(flag_value(argv, flags))

    def headless(self, argv: Sequence[str]) -> bool:
        return any(arg in self.headless_flags for arg in argv)

    def address(self, argv: Sequence[str]) -> str:
        """The first rendezvous address given (`host:port`), "" when none is."""
        for way in self.rendezvous:
            host = flag_value(argv, way.host_flags)
            if host:
                port = flag_value(argv, way.port_flags) or way.default_port
                return f"{host}:{port}" if way.port_flags else host
        return ""


@dataclass(frozen=True)
class Engine:
    name: str
    # Regex matched at the start of what the main process runs (`discovery.processes.invocation`: argv[0], or a
    # Python interpreter's module or script, and the arguments after it); None: never auto-discovered.
    program: re.Pattern[str] | None
    default_port: int | None
    default_host: str = "127.0.0.1"
    health_path: str = "/health"
    # Regex on a child's command line: its `role` group is the role (a title set by setproctitle, e.g.
    # `sglang::scheduler_TP3`), or else the name of its named group that matched is (a child that runs a program of
    # its own: Ollama's `(?P<runner>llama-server|ollama runner)`).
    role_title: re.Pattern[str] | None = None
    rules: tuple[Rule, ...] = ()
    shards: re.Pattern[bytes] | None = None
    # Whole lines, each preceded by its `\n`, that a busy server prints by the thousand and that can carry no
    # event: skipped in bulk once serving, so the prefilter does not scan them byte by byte.
    routine_lines: re.Pattern[bytes] | None = None
    port_flags: tuple[str, ...] = ("--port",)
    host_flags: tuple[str, ...] = ("--host",)
    # An environment variable that gives the listen address where no flag does (Ollama's `OLLAMA_HOST`,
    # `[scheme://]host[:port][/path]`); None: the command line and the defaults only.
    address_env: str | None = None
    # An environment variable that gives the port alone where no flag does (Dynamo's `DYN_SYSTEM_PORT`); without
    # it and without a default port the server has no port (nothing probed, nothing fetched).
    port_env: str | None = None
    # The key of the JSON object a failing health answer carries whose value says why, in the engine's own words
    # (LMDeploy's `{"status": "unhealthy", "message": "Backend scheduler_tick has not advanced for 95.3s."}`): read
    # into the probe's failure reason. None: the body is not read.
    health_message: str | None = None
    model_flags: tuple[str, ...] = ()
    # The sub-commands or programs (by the last part of their path) after which the model is the first positional
    # argument, the first of them found in this order: `vllm serve <model>`, `trtllm-serve [serve] <model>`.
    model_commands: tuple[str, ...] = ()
    tp_flags: tuple[str, ...] = ()
    # Regex matched at the start of the command line (argv joined by spaces) whose `model` group is the model, for a
    # process title that replaced the command line (Xinference's `Model: <uid>`); None: the flags and commands only.
    title_model: re.Pattern[str] | None = None
    # A process that its host ends when its model is unloaded, with no line of its own (an Xinference worker's model
    # actor, `xinference terminate`): it is gone on request unless it failed (no InferenceServerDown).
    exit_is_stop: bool = False
    # The environment variables in which an MPI launcher gives each process it starts its rank (Open MPI's
    # `OMPI_COMM_WORLD_RANK`, PMIx's `PMIX_RANK`, MPICH's `PMI_RANK`), for an engine launched once per rank of which
    # only rank 0 serves (Triton's TensorRT-LLM backend): a process of a rank above 0 is never a server of its own,
    # it is part of rank 0's (`Server`: the launcher's other ranks join rank 0's tree).
    rank_env: tuple[str, ...] = ()
    metrics: MetricsSpec | None = None  # None: no `/metrics` page known
    loaded_models: LoadedModels | None = None  # None: no page of its loaded models known
    runner_loops: RunnerLoops | None = None  # None: no runner of its own serves a page through its loop
    stats_lines: tuple[StatsLine, ...] = ()
    # Lines an engine keeps printing while stuck (a wait loop's notice): not progress, so a log of nothing
    # else does not move `log_last_progress` (see `heartbeats()`).
    heartbeats: re.Pattern[bytes] | None = None
    multinode: MultiNode | None = None  # None: the engine never spans nodes
    # What the engine writes before each line of its own (its logger's prefix), a regex that may match nothing:
    # a traceback's lines are read past it (`logs.tracebacks`).
    line_prefix: bytes = b""
    disaggregation: Disaggregation | None = None  # None: the engine has no PD roles
    pending_lines: tuple[PendingLine, ...] = ()  # its lines that give PD stages' pending requests
    router: Router | None = None  # a PD router: the servers it pairs are on its command line
    # The pid of the process that wrote a line, from its prefix (group 1), where the engine writes one: which server's
    # a line is, in a file that several servers' processes write (`logs.shared`).
    line_pid: re.Pattern[bytes] | None = None

    def all_rules(self) -> tuple[Rule, ...]:
        return self.rules + COMMON_RULES

    def with_rules(self, extra_rules: Iterable[Rule]) -> Engine:
        """A copy whose configured rules take precedence over the built-in ones."""
        return replace(self, rules=tuple(extra_rules) + self.rules)

    def as_worker(self) -> Engine:
        """The engine as a worker node of a multi-node deployment reads its log: its worker rules first."""
        return self if self.multinode is None else replace(self, rules=self.multinode.worker_rules + self.rules)

    def listen_address(self, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[str, int | None]:
        """Host and port that the server listens on, from its argv, its environment (`address_env`, in `environ`)
        or the engine defaults."""
        env_host, env_port = self._env_address(environ or {})
        if self.port_env:
            env_port = (environ or {}).get(self.port_env, "").strip() or env_port
        host = flag_value(argv, self.host_flags) or env_host or self.default_host
        port_text = flag_value(argv, self.port_flags) or env_port
        port = int(port_text) if port_text and port_text.isascii() and port_text.isdigit() else self.default_port
        return host, port if port is not None and 0 < port < 65536 else self.default_port

    def _env_address(self, environ: Mapping[str, str]) -> tuple[str, str]:
        """Host and port text of `address_env` ("" each where it gives none), read as Ollama reads `OLLAMA_HOST`
        (ollama/ollama `envconfig/config.go:22-59`): a scheme is optional and sets the default port (`http` 80,
        `https` 443), a path after the address is dropped, `[::1]:N` is IPv6."""
        value = environ.get(self.address_env, "").strip() if self.address_env else ""
        if not value:
            return "", ""
        scheme, has_scheme, address = value.partition("://")
        if not has_scheme:
            scheme, address = "", value
        address = address.split("/", 1)[0]
        host, colon, port = address.rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        if not colon or ((":" in host or host.startswith("[")) and not bracketed):  # no port; a bare IPv6 address
            host, port = address, {"http": "80", "https": "443"}.get(scheme, "")
        return host.strip("[]"), port

    def mpi_rank(self, environ: Mapping[str, str]) -> int | None:
        """The rank an MPI launcher gave the process, from its environment (`rank_env`); None when it has none."""
        return next((rank for key in self.rank_env if (rank := whole_number(environ.get(key))) is not None), None)

    def model(self, argv: Sequence[str]) -> str:
        """The model the server was started with, from its flags or `<command> <model>`; "" when unknown."""
        found = flag_value(argv, self.model_flags)
        names = [arg.rsplit("/", 1)[-1] for arg in argv]
        command = next((command for command in self.model_commands if command in names), None)
        if found is None and command is not None:
            rest = argv[names.index(command) + 1:]
            found = rest[0] if rest and not rest[0].startswith("-") else None
        titled = self.title_model.match(" ".join(argv)) if found is None and self.title_model else None
        return found or (titled.group("model") if titled else "")

    def tensor_parallel(self, argv: Sequence[str]) -> str:
        """Tensor-parallel size as given on the command line; "" when not given or not a number."""
        found = flag_value(argv, self.tp_flags) or ""
        return found if found.isascii() and found.isdigit() else ""


def whole_number(text: str | None) -> int | None:
    """A small count or rank as another process wrote it (a flag, an environment value); None if it is none."""
    return int(text) if text and text.isascii() and text.isdigit() and len(text) < 7 else None


def heartbeats(*regexes: str) -> re.Pattern[bytes]:
    """One pattern for the lines that are heartbeats, not progress."""
    return re.compile("|".join(f"(?:{r})" for r in regexes).encode())


def flag_values(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """Every value of a repeated flag (`--decode URL --decode URL`)."""
    out = []
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                out.append(argv[i + 1])
            elif arg.startswith(flag + "="):
                out.append(arg[len(flag) + 1:])
    return out


def flag_list(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """The values after a flag that takes a list (`--prefiller-hosts a b c`), up to the next flag; the last
    such flag wins, as argparse's `nargs="+"`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg in flags:
            out = []
            for value in argv[i + 1:]:
                if value.startswith("-"):
                    break
                out.append(value)
        elif any(arg.startswith(flag + "=") for flag in flags):
            out = [arg.split("=", 1)[1]]
    return out


def port_flag(argv: Sequence[str], flags: Sequence[str], default: int | None) -> int | None:
    """The port a flag gives (one of `flags`), else `default`."""
    port = whole_number(flag_value(argv, flags))
    return port if port is not None and 0 < port < 65536 else default


def flag_value(argv: Sequence[str], flags: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1 :]
    return None
