"""Every metric family stallwatch can emit, in one catalog: name, type, help and labels.

Collectors build fresh families from this catalog on every scrape, so names and HELP texts live in one
place and the README's metric table can be checked against it. A family marked `detail` is read by no shipped rule
or dashboard panel: it is exported only when its collector's details are on (`<collector>.details`,
`--collector.<collector>.details`), so that a node stays within its series budget (README "Series budget").
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "stallwatch_"


@dataclass(frozen=True)
class Family:
    kind: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]
    detail: bool = False  # only with its collector's details on


GPU = ("gpu", "uuid")
PROC = ("server", "process")
LOG = ("server", "log")  # `log`, `probe`: stable names (stallwatch.stable_names); where they are in *_info
PROBE = ("server", "probe")
ENGINE = ("server", "source")

CATALOG: dict[str, Family] = {
    # GPU
    "gpu_info": Family("gauge", "GPU identity; always 1.", (*GPU, "name", "driver_version"), detail=True),
    "gpu_up": Family("gauge", "1 when the GPU answered NVML in this scrape, 0 when lost or failing.", GPU),
    "gpu_memory_used_bytes": Family("gauge", "GPU memory in use, bytes.", GPU, detail=True),
    "gpu_memory_total_bytes": Family("gauge", "GPU memory in total, bytes.", GPU, detail=True),
    "gpu_utilization_ratio": Family(
        "gauge", "Fraction of NVML's last sample period in which a kernel ran (0..1).", GPU, detail=True),
    "gpu_busy_seconds_total": Family(
        "counter", "Seconds a kernel ran, integrated from NVML utilization samples; rate() is the mean "
        "utilization over any window.", GPU, detail=True),
    "server_gpu_memory_used_bytes": Family(
        "gauge", "GPU memory held by the server's processes on that GPU, bytes.", ("server", *GPU)),
    # The busy counter again, with its server: the rules read a server's GPUs without joining every GPU's counter
    # with server_gpu_memory_used_bytes on every evaluation (issue 31: the costliest rule).
    "server_gpu_busy_seconds_total": Family(
        "counter", "Seconds a kernel ran on a GPU the server holds memory on (stallwatch_gpu_busy_seconds_total with "
        "its server: one series per server_gpu_memory_used_bytes series).", ("server", *GPU)),
    "nvml_up": Family("gauge", "1 when the NVIDIA driver library answered, 0 when unavailable.", ()),
    "nvml_expected": Family(
        "gauge", "1 when NVML is expected to answer (the node shows an NVIDIA device or driver, or the GPU collector "
        "was asked for by name), 0 on a node that shows no NVIDIA GPU.", ()),
    # GPU health: each only where the GPU supports it (absent, never zero, otherwise)
    "gpu_power_watts": Family("gauge", "Power the GPU draws, watts.", GPU),
    "gpu_power_limit_watts": Family("gauge", "Power limit the driver enforces on the GPU, watts.", GPU),
    "gpu_energy_joules_total": Family(
        "counter", "Energy the GPU used since the driver loaded, joules.", GPU, detail=True),
    "gpu_recovery_action": Family(
        "gauge", "The driver's recovery action for the GPU (NVML GET_GPU_RECOVERY_ACTION): 0 none, 1 GPU reset, "
        "2 node reboot, 3 drain P2P, 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot.", GPU),
    "gpu_ecc_uncorrected_errors_total": Family(
        "counter", "Uncorrected ECC errors since the driver loaded (volatile).", GPU),
    "gpu_remapped_rows": Family(
        "gauge", "Remapped memory rows by kind (correctable, uncorrectable); pending and failure are 1 when a remap "
        "waits for a reset or failed.", (*GPU, "kind"), detail=True),
    "gpu_pcie_replays_total": Family("counter", "PCIe replays of the GPU.", GPU, detail=True),
    "gpu_clock_event_reasons": Family(
        "gauge", "Why the GPU's clocks are held down now, NVML's bitmask of nvmlClocksEventReason* (0x1 GPU idle, 0x2 "
        "applications clocks setting, 0x4 SW power cap, 0x8 HW slowdown, 0x10 sync boost, 0x20 SW thermal slowdown, "
        "0x40 HW thermal slowdown, 0x80 HW power brake slowdown, 0x100 display clock setting); 0 when none.", GPU),
    "gpu_xid_errors_total": Family(
        "counter", "Xid errors NVML reported for the GPU since the exporter started (its event API).", (*GPU, "xid")),
    "gpu_xid_last_timestamp_seconds": Family(
        "gauge", "When the exporter received the GPU's last Xid of this kind, seconds since the epoch.",
        (*GPU, "xid")),
    # The Xids and a pending recovery action again, with the server of each GPU: the fault page reads a server's GPUs
    # without joining every GPU's memory with them on every evaluation (issue 31), and a GPU that hangs (its memory
    # withheld) still names its servers. Only where there is one: a few series in a fleet, not one per GPU.
    "server_gpu_xid_last_timestamp_seconds": Family(
        "gauge", "When the exporter received the last Xid of this kind of a GPU the server holds memory on, or held "
        "memory on in the GPU's last reading that answered while it does not answer now "
        "(stallwatch_gpu_xid_last_timestamp_seconds with its server), seconds since the epoch.",
        ("server", *GPU, "xid")),
    "server_gpu_recovery_action": Family(
        "gauge", "The driver's recovery action for a GPU the server holds memory on, where it asks for one "
        "(stallwatch_gpu_recovery_action with its server; no series while it asks for none): 1 GPU reset, 2 node "
        "reboot, 3 drain P2P, 4 drain and reset, 5 recover IMEX domain, 6 bus reset, 7 system reboot.",
        ("server", *GPU)),
    "gpu_unattributed_memory_bytes": Family(
        "gauge", "GPU memory held by processes in no watched server's tree (gone, or someone else's), bytes.", GPU),
    # Process tree
    "discovery_skipped_processes": Family(
        "gauge", "Processes with an engine's command line not watched in the last discovery pass: the caps "
        "discovery.max_servers and max_servers_per_user were reached.", ()),
    "server_up": Family("gauge", "1 when the server's main process is running.", ("server",)),
    "server_configured": Family(
        "gauge", "1 for a server of the config file's servers:, 0 for one that discovery found.", ("server",)),
    "server_stop_requested": Family(
        "gauge", "1 when the server's current launch logged that it was asked to stop (its engine's stop line, or "
        "a traceback ending in KeyboardInterrupt).", ("server",)),
    "server_start_time_seconds": Family(
        "gauge", "Start time of the server's main process, seconds since the epoch.", ("server",)),
    "server_processes": Family(
        "gauge", "Processes in the server's tree by state (R, S, D, Z, T, I).", ("server", "state")),
    "process_cpu_seconds_total": Family(
        "counter", "CPU seconds used by the processes of this role; exited children keep their share.",
        (*PROC, "mode")),
    "process_resident_memory_bytes": Family(
        "gauge", "Resident memory of the processes of this role.", PROC, detail=True),
    "process_threads": Family("gauge", "Threads of the processes of this role.", PROC, detail=True),
    # Logs
    "log_info": Family("gauge", "Where the server's log is: the node's path of the file, or journal:<unit>; always 1.",
                       (*LOG, "path")),
    "log_up": Family("gauge", "1 when the log file is readable.", LOG),
    "log_size_bytes": Family("gauge", "Current size of the log file, bytes.", LOG, detail=True),
    "log_read_bytes_total": Family(
        "counter", "Bytes read from the log, across rotation and truncation.", LOG, detail=True),
    "log_lines_total": Family("counter", "Lines read from the log, across rotation and truncation.", LOG, detail=True),
    "log_shared": Family(
        "gauge", "1 when the log file is another watched server's log too: only its lines whose prefix names one of "
        "this server's processes count for its phase and events.", LOG, detail=True),
    "log_backlog_bytes": Family("gauge", "Bytes of the log file not read yet.", LOG, detail=True),
    "log_skipped_bytes_total": Family(
        "counter", "Bytes of the log left unread because it grew faster than its read budget.", LOG, detail=True),
    "log_last_line_timestamp_seconds": Family(
        "gauge", "When the log last grew (bytes, not only newlines), seconds since the epoch.", LOG),
    "log_last_line_age_seconds": Family("gauge", "Seconds since the log last grew.", LOG),
    "log_events_total": Family("counter", "Notable log lines by kind.", ("server", "event")),
    "log_last_event_timestamp_seconds": Family(
        "gauge", "When the server last logged a notable line of this kind (server_restart: its last relaunch), "
        "seconds since the epoch.", ("server", "event")),
    "log_last_progress_timestamp_seconds": Family(
        "gauge", "When the server logged a line that is not a heartbeat (a notice an engine repeats while stuck), "
        "seconds since the epoch.", ("server",)),
    # The engine's own view: source "metrics" (its /metrics page) or "log" (its periodic stats lines)
    "engine_requests_running": Family("gauge", "Requests the engine is running, as it last reported them.", ENGINE),
    "engine_requests_waiting": Family("gauge", "Requests waiting in the engine's queue, as it last reported them.",
                                      ENGINE),
    "engine_generated_tokens_total": Family(
        "counter", "Tokens the engine generated; never decreases across an engine restart (from the log: its "
        "generation throughput integrated between stats lines).", ENGINE),
    "engine_stats_timestamp_seconds": Family(
        "gauge", "When the engine's figures were last seen, seconds since the epoch.", ENGINE),
    "engine_metrics_up": Family(
        "gauge", "1 when the engine's /metrics page answered its last fetch, 0 when it failed or timed out.",
        ("server",)),
    "engine_model_gpu_memory_bytes": Family(
        "gauge", "Bytes of GPU memory each model the engine has loaded holds, as the engine reports it (Ollama's "
        "/api/ps size_vram); one series per model loaded now, none once it is unloaded.", ("server", "model")),
    "engine_loop_up": Family(
        "gauge", "For an engine whose main loop serves its /metrics page (llama.cpp) or whose runners' loops serve "
        "a page (Ollama's /slots): 1 when the loop answered the last fetch, 0 when the fetch timed out (a request "
        "the loop holds unanswered).", ("server",)),
    # Startup phase
    "startup_phase": Family("gauge", "1 for the server's current startup phase, 0 for the others.",
                            ("server", "phase")),
    "startup_phase_start_timestamp_seconds": Family(
        "gauge", "When the server entered its current phase, seconds since the epoch.", ("server",)),
    "weight_shards_loaded": Family("gauge", "Weight shards loaded so far in the current launch.", ("server",)),
    # Not `weight_shards_total`: a `_total` name is a counter's (OpenMetrics; `promtool check metrics` says so).
    "weight_shards_expected": Family("gauge", "Weight shards to load in the current launch.", ("server",)),
    # Probes
    "probe_info": Family("gauge", "The URL the server's probe gets; always 1.", (*PROBE, "url")),
    "probe_success": Family("gauge", "1 when the last probe succeeded.", PROBE),
    "probe_duration_seconds": Family("gauge", "Duration of the last probe.", PROBE),
    "probe_http_status_code": Family("gauge", "HTTP status of the last probe; 0 when none came.", PROBE, detail=True),
    "probe_last_success_timestamp_seconds": Family(
        "gauge", "When a probe last succeeded, seconds since the epoch.", PROBE, detail=True),
    "probe_failures_total": Family(
        "counter", "Failed probes by reason (refused, timeout, http_status, error, unreachable).", (*PROBE, "reason")),
    # Where the server lives
    "server_info": Family(
        "gauge", "What the server is and where it runs (runtime kubernetes, docker, systemd or host); always 1.",
        ("server", "engine", "model", "tensor_parallel", "runtime", "namespace", "pod", "container", "container_id",
         "unit")),
    "server_listening": Family(
        "gauge", "1 when the engine's port has a listening socket in the server's own network namespace.",
        ("server", "port")),
    # Deployments over several nodes (only their members)
    "deployment_member_info": Family(
        "gauge", "The server is one node of a multi-node deployment: its key (the same on every node), role (head or "
        "worker), node rank and node count; always 1.", ("server", "deployment", "role", "node_rank", "nnodes")),
    "deployment_node_expected": Family(
        "gauge", "1 for each node rank (0 .. nnodes-1) the server's deployment expects.",
        ("server", "deployment", "node_rank")),
    "probe_authoritative": Family(
        "gauge", "1 when the server's own health probe judges it (a deployment's head), 0 on a worker node whose "
        "/health is a constant or absent.", ("server",)),
    "deployment_member_ranks": Family(
        "gauge", "Rank processes (schedulers, workers) of the member's tree that live now.", ("server",)),
    "deployment_member_ranks_started": Family(
        "gauge", "The most rank processes the member's tree has had in this launch.", ("server",)),
    # Prefill/decode disaggregated groups (only their members and routers)
    "pd_member_info": Family(
        "gauge", "The server is a member of a prefill/decode disaggregated group: the group's key (the same on every "
        "member; empty when no router, config or Dynamo graph names it) and its role (prefill, decode or router); "
        "always 1.", ("server", "pd_group", "pd_role")),
    "engine_requests_pending": Family(
        "gauge", "Requests a PD member holds outside running and waiting, by stage (bootstrap: a prefill waits for the "
        "decode side's handshake; inflight: prefilled, KV being sent; prealloc: a decode waits for KV memory; "
        "transfer: it waits for the KV data), as it last reported them.", (*ENGINE, "stage")),
    "engine_kv_transfers_total": Family(
        "counter", "KV transfers the PD member completed; never decreases across an engine restart.", ENGINE),
    "router_metrics_up": Family(
        "gauge", "1 when the router's own metrics page answered its last fetch, 0 when it failed.", ("server",)),
    "router_worker_up": Family(
        "gauge", "The router's own view of each worker: 1 healthy, 0 not (its health checks, its circuit breaker); "
        "role as its command line lists the worker (prefill, decode; empty for one registered at run time).",
        ("server", "worker", "role")),
    "router_requests_running": Family(
        "gauge", "Requests the router has in flight over its workers, as it last reported them.", ("server",)),
    # Thresholds
    "stall_gpu_memory_threshold_bytes": Family(
        "gauge", "GPU memory above which the server counts as loaded (config stall.gpu_memory_bytes).",
        ("server",)),
    "stall_log_stale_threshold_seconds": Family(
        "gauge", "Log silence after which the server's log counts as stale (config stall.log_stale).",
        ("server",)),
    # Self
    "collector_success": Family("gauge", "1 when the collector succeeded in this scrape.", ("collector",)),
    "collector_duration_seconds": Family(
        "gauge", "Time the collector took in this scrape (only for a collector whose details are on).",
        ("collector",), detail=True),
    "build_info": Family("gauge", "stallwatch build; always 1.", ("version",)),
}


def detail_names() -> frozenset[str]:
    """The exposition names of the detail families (a counter's without `_total`, as prometheus_client names it)."""
    return frozenset(family(name).name for name, spec in CATALOG.items() if spec.detail)


def family(short_name: str) -> Metric:
    """A new, empty family for `stallwatch_<short_name>`, with the catalog's type, HELP and labels."""
    spec = CATALOG[short_name]
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return cls(PREFIX + short_name, spec.help, labels=list(spec.labels))
