"""The report on a server: its sections as dataclasses (`stallwatch diagnose --json` writes them as they are,
checked against `diagnose.schema.json`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = Path(__file__).parent / "diagnose.schema.json"


@dataclass(frozen=True)
class DeploymentInfo:
    """The server as one node of a multi-node deployment (`discovery/deployment.py`)."""

    deployment: str
    role: str  # head | worker
    node_rank: int
    nnodes: int
    ranks: int | None  # rank processes (schedulers, workers) that live now; None when not counted
    ranks_started: int | None  # the most this launch has had


@dataclass(frozen=True)
class PdInfo:
    """The server as a member of a prefill/decode disaggregated group (`discovery/pd.py`)."""

    group: str  # "" where nothing on this node names it
    role: str  # prefill | decode | router
    pending: dict[str, float]  # requests pending by PD stage, as the engine last reported them
    transfers: float | None = None  # KV transfers it completed (None: not counted)
    workers: dict[str, float] = field(default_factory=dict)  # a router's view: each worker 1 healthy, 0 not


@dataclass(frozen=True)
class Identity:
    engine: str
    model: str
    tensor_parallel: str
    runtime: str
    namespace: str
    pod: str
    container: str
    unit: str
    pid: int | None
    port: int | None
    deployment: DeploymentInfo | None = None  # None: a single-node server
    configured: bool = False  # from the config file's `servers:` (someone said it should run); False: discovered
    pd: PdInfo | None = None  # None: no member of a prefill/decode group


@dataclass(frozen=True)
class PhaseInfo:
    phase: str
    since: float
    seconds: float
    quiet_seconds: float  # since the last log line that is not a heartbeat (else since the phase began)
    timeline: list[str]
    timeline_note: str
    shards_loaded: int | None
    shards_expected: int | None
    stop_requested: bool = False  # this launch logged that it was asked to stop (the engine's stop line)


@dataclass(frozen=True)
class XidInfo:
    xid: int
    count: int  # NVML's events since the exporter started (0: seen only in the kernel log)
    seconds_ago: float  # since the last one
    kind: str  # fault | application | information (signals/xid.py's XIDS)
    meaning: str
    pid: int | None = None  # from the kernel log's last line of it, where readable
    process: str = ""  # that process's name in the line
    role: str = ""  # its role in this server's tree; "" when it is not in it
    detail: str = ""  # the rest of that line


@dataclass(frozen=True)
class GpuInfo:
    index: str
    uuid: str
    name: str
    memory_used_bytes: float
    memory_total_bytes: float
    server_memory_bytes: float | None  # held by this server; None: not one of its GPUs
    utilization: float | None
    busy_ratio: float | None  # mean utilization over NVML's buffer of recent samples (the last minutes at most)
    busy_window_seconds: float  # the span of those samples
    power_watts: float | None = None  # None: the GPU does not report it
    power_limit_watts: float | None = None
    recovery_action: int | None = None  # what the driver asks for (nvmlGpuRecoveryAction_t)
    xids: list[XidInfo] = field(default_factory=list)  # the Xids it reported while the exporter watched
    # False: the GPU does not answer NVML now (hung, lost); its memory figures are from its last answer, the rest None
    answering: bool = True


@dataclass(frozen=True)
class GpuSection:
    nvml_up: bool
    error: str
    gpus: list[GpuInfo] = field(default_factory=list)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    role: str
    state: str
    cpu_seconds: float  # over the sample window
    wchan: str  # the kernel wait channel of a process in D state


@dataclass(frozen=True)
class Frame:
    function: str
    location: str
    wait: bool


@dataclass(frozen=True)
class ThreadStack:
    name: str
    status: str
    frames: list[Frame]


@dataclass(frozen=True)
class StackGroup:
    """Processes whose stacks are identical (TP ranks), printed once."""

    roles: list[str]
    pids: list[int]
    threads: list[ThreadStack]
    error: str  # why py-spy gave no stack


@dataclass(frozen=True)
class ProbeInfo:
    url: str
    success: bool | None  # None: not made
    status: int
    reason: str
    duration_seconds: float


@dataclass(frozen=True)
class PortInfo:
    port: int | None
    listening: bool | None
    addresses: list[str]
    probes: list[ProbeInfo]


@dataclass(frozen=True)
class EngineInfo:
    source: str  # metrics | log | "" (none)
    running: float | None
    waiting: float | None
    tokens: float | None
    tokens_in_window: float | None  # generated during the sample window; None when not measured
    error: str
    # Bytes of GPU memory by model the engine has loaded, from its own page (Ollama's `/api/ps`); None: no such page
    # or it did not answer.
    models: dict[str, float] | None = None


@dataclass(frozen=True)
class LogInfo:
    sources: list[str]
    lines: list[str]
    events: dict[str, int]


@dataclass(frozen=True)
class Verdict:
    status: str  # healthy | starting | stopped (on request) | stalled | failed | down
    text: str


@dataclass(frozen=True)
class ServerReport:
    name: str
    identity: Identity
    phase: PhaseInfo
    gpu: GpuSection
    window_seconds: float
    processes: list[ProcessInfo]
    stacks: list[StackGroup]
    port: PortInfo
    engine_figures: EngineInfo
    log: LogInfo
    verdict: Verdict


@dataclass(frozen=True)
class Report:
    version: str
    generated_at: float
    servers: list[ServerReport]
    # The running exporter's URL it came from, for a server diagnose's own look cannot see (its process is gone):
    # what the exporter keeps, its prober's last results and its last minute; "": a look now.
    from_exporter: str = ""

    @property
    def exit_code(self) -> int:
        return 1 if any(s.verdict.status in ("stalled", "failed", "down") for s in self.servers) else 0


@dataclass(frozen=True)
class Observation:
    """What was seen of a server: by diagnose's own look over a short window (`oneshot`), or from the exporter's
    running state (`live`). Log lines and stacks are empty where they are not to be shown."""

    window: float
    processes: list[ProcessInfo]
    stacks: list[StackGroup]
    port: PortInfo
    engine: EngineInfo
    gpu: GpuSection
    log_lines: list[str]
    pd: PdInfo | None = None  # its prefill/decode group, as the exporter reads it
