"""A synthetic fleet for tests/bench/bench_fleet.py: N nodes of 8 GPUs, each with one TP=8 server, whose series are
the ones the real exporter emits and whose values follow a model of the node's state, with the alerts each node
must raise (the ground truth).

The series come from a live scrape, not a list: `live_template` runs the exporter on 8 fake GPUs with every health
field (tests/support/fakes/pynvml.py) beside a simulated serving SGLang or vLLM (tests/sim), and each node repeats
that scrape's series with its own labels (Kubernetes pod, pod-IP probe URL, pod log path, GPU UUIDs). A family the
exporter adds or drops therefore shows up here without a change; the model moves the values of the families the
rules and dashboards read, and keeps the template's value for the rest. Every family must be in the exporter's
catalog (stallwatch.collectors.catalog).

States per block of 100 nodes: 88 healthy idle (traffic bursts of 30-240 s every ~20 min, silent log and 0 % GPU
between them), 7 busy, 2 stalled the seed's way (loading_weights with 76 GB per GPU, 0 %, log silent, probe refused,
port closed: one since before the history, one relaunched inside it), 1 post-ready hang (requests held, no token;
vLLM keeps logging and warns once a minute), and 2 idle ones whose GPU 3 reports Xid 48 (an uncorrectable ECC error)
and whose driver then asks for a GPU reset: one two minutes into the live tail (InferenceServerGpuFault from then
on), one an hour before it, its GPU reset 10 minutes later (too old to page). Noise that must not page: probe
timeouts lasting one scrape. Values are pure functions of (node, time), so the history and the live tail agree.
"""

from __future__ import annotations

import bisect
import math
import random
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.collectors.catalog import CATALOG, PREFIX
from support import transcripts
from support.harness import Engine, Exporter, gpus, poll

STEP = 15.0  # seconds between two samples of the history (the scrape interval of the live tail)
GPUS = 8
GB = 1e9
NOISE = {"busy": 0.01, "idle": 0.001, "hung": 0.001, "faulted": 0.001}  # probe timeouts lasting one scrape, per scrape

# The alerts each state must raise; every other alert must stay silent.
EXPECTED = {
    "idle": set(),
    "busy": set(),
    "stalled": {"InferenceServerLoadedButIdle", "InferenceServerStartupStuck"},
    "hung": {"InferenceServerNoTokenProgress"},
    "faulted": set(),  # and InferenceServerGpuFault from its Xid until 15 minutes after it or its reset, the later
}
HUNG_VLLM_EXTRA = {"InferenceServerRepeatedStallWarnings"}  # its `No available shared memory broadcast block`
FAULT_GPU, FAULT_XID, FAULT_WINDOW = "3", "48", 900.0  # the faulted nodes' Xid; the rule's window for it (15m)
RESET_AFTER = 600.0  # seconds from the old fault to its GPU's reset (its recovery action back to 0)

SERVE_ARGS = {"sglang": ("--enable-metrics",)}  # each engine as a fleet runs it

MODELS = {
    "sglang": ["Qwen/Qwen3-235B-A22B", "meta-llama/Llama-3.3-70B-Instruct", "zai-org/GLM-4.5-Air"],
    "vllm": ["meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "openai/gpt-oss-120b"],
}


# --- the template: one live scrape per engine -------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    family: str  # catalog name, without the prefix ("gpu_busy_seconds_total")
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Template:
    engine: str
    server: str  # the template server's name, replaced by each node's
    port: str
    series: tuple[Series, ...]
    headers: dict[str, str]  # family -> its `# HELP` and `# TYPE` lines, as the exporter wrote them


def live_template(tmp: Path, engine: str) -> Template:
    """The exporter's scrape of one serving TP=8 `engine` server on 8 fake GPUs with every health field."""
    transcript = transcripts.vllm_healthy(tp=GPUS) if engine == "vllm" else transcripts.sglang_healthy(tp=GPUS)
    # SGLang serves its /metrics page only with --enable-metrics; without it a hang that stops its log leaves the
    # exporter no current figures (and InferenceServerNoTokenProgress nothing to read).
    sim = Engine(tmp, engine, transcript, final="serve", tp=GPUS, args=SERVE_ARGS.get(engine, ()),
                 work={"running": 4, "waiting": 0, "throughput": 500.0, "interval": 1})
    exporter = None
    try:
        tree = poll(lambda: (p := psutil.Process(sim.proc.pid)) and len(p.children(recursive=True)) >= GPUS and p,
                    timeout=60, what=f"{engine}'s {GPUS} ranks")
        ranks = sorted(tree.children(recursive=True), key=lambda c: c.pid)[-GPUS:]
        nvml = gpus(GPUS, used=76e9, util=0, power=85, power_limit=700, energy=1e6, recovery_action=0,
                    ecc_uncorrected=0, remapped_rows=[0, 0, 0, 0], pcie_replays=0, clock_reasons=0)
        for gpu, rank in zip(nvml, ranks, strict=True):
            gpu["processes"] = [{"pid": rank.pid, "used": 75e9}]
        # One Xid and a recovery action, so that their families (per GPU and with the server) are in the template;
        # the faulted nodes show them.
        events = [{"id": 1, "gpu": int(FAULT_GPU), "data": int(FAULT_XID)}]
        nvml[int(FAULT_GPU)]["recovery_action"] = 1
        # Discovery off: this machine's other engines are no part of the node. The collectors' defaults, as a node
        # runs them (no detail families: the test harness turns those on for its evidence).
        exporter = Exporter(tmp, nvml={"gpus": nvml, "events": events}, details=False, config=(
            "discovery: {enabled: false}\n"
            "engine_metrics: {interval: 1s, timeout: 1s}\n"
            f"servers:\n  - name: {engine}-template\n    engine: {engine}\n"
            f"    match: {{cmdline: '--port {sim.port}\\b'}}\n"))
        scrape = exporter.wait_for(
            lambda s: len(s.samples(f"{PREFIX}server_gpu_memory_used_bytes")) == GPUS
            and s.value(f"{PREFIX}probe_success") == 1 and s.value(f"{PREFIX}startup_phase", phase="serving") == 1
            and {ls["source"] for ls in s.labelsets(f"{PREFIX}engine_requests_running")} == {"metrics", "log"}
            and s.labelsets(f"{PREFIX}server_gpu_xid_last_timestamp_seconds")
            and s.labelsets(f"{PREFIX}server_gpu_recovery_action") and s,
            timeout=60, what=f"the {engine} node's series")
        return _template(engine, f"{engine}-template", str(sim.port), scrape.text)
    finally:
        if exporter is not None:
            exporter.stop()
        sim.stop()


def _template(engine: str, server: str, port: str, text: str) -> Template:
    series, headers = [], {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix(PREFIX)
            if not sample.name.startswith(PREFIX) or sample.name.endswith("_created"):
                continue
            if name not in CATALOG:
                raise AssertionError(f"{sample.name}: in the scrape, not in the catalog")
            headers[name] = (f"# HELP {sample.name} {family.documentation}\n"
                             f"# TYPE {sample.name} {CATALOG[name].kind}\n")
            series.append(Series(name, tuple(sorted(sample.labels.items())), sample.value))
    return Template(engine, server, port, tuple(series), headers)


def templates() -> dict[str, Template]:
    """Both engines' templates, from live scrapes in a scratch folder."""
    with tempfile.TemporaryDirectory(prefix="stallwatch-fleet-template-") as tmp:
        found = {}
        for engine in ("sglang", "vllm"):
            folder = Path(tmp) / engine
            folder.mkdir()
            found[engine] = live_template(folder, engine)
        return found


# --- the nodes -----------------------------------------------------------------------------------------------------

@dataclass
class Node:
    index: int
    engine: str
    state: str  # idle | busy | stalled | hung | faulted
    onset: float  # stalled, hung: when it began; faulted: its Xid; else the server's start
    restarted: bool  # stalled: relaunched at `onset` inside the history (idle serving before)
    start: float  # when the server (first) started
    util: float  # busy: its GPUs' mean utilization
    tokens_per_s: float
    running: int
    bursts: list[tuple[float, float]]  # idle traffic: (start, end), sorted
    burst_ends: list[float] = field(default_factory=list)
    burst_prefix: list[float] = field(default_factory=list)  # busy seconds of the bursts before each one
    noise: list[int] = field(default_factory=list)  # scrape steps whose probe timed out, sorted
    reset_at: float = math.inf  # faulted: when its GPU was reset (its recovery action 0 again)

    @property
    def instance(self) -> str:
        return f"node-{self.index:04d}:9847"

    def expected(self, t: float) -> set[str]:
        """The alerts the node must raise at `t`."""
        fault = self.state == "faulted" and self.onset <= t < max(self.onset + FAULT_WINDOW, self.reset_at)
        return EXPECTED[self.state] | (HUNG_VLLM_EXTRA if self.state == "hung" and self.engine == "vllm" else set()) \
            | ({"InferenceServerGpuFault"} if fault else set())


BURST_UTIL = 0.6


def make_node(index: int, now: float, horizon: float) -> Node:
    """Node `index` of a fleet whose history ends at `now` and whose live tail ends by `horizon`; the same index
    always gives the same node, so 100 nodes are the first 100 of 1000."""
    rng = random.Random(index)
    slot = index % 100
    state = {17: "stalled", 61: "stalled", 42: "hung", 33: "faulted", 88: "faulted"}.get(slot) or \
        ("busy" if slot in (5, 23, 38, 50, 71, 84, 96) else "idle")
    if state == "stalled":
        engine = "sglang"  # the seed's
    elif state == "hung":
        engine = "vllm" if (index // 100) % 2 == 0 else "sglang"  # both engines' hangs, block by block
    else:
        engine = rng.choice(["sglang"] * 11 + ["vllm"] * 9)
    restarted = state == "stalled" and slot == 61
    start = now - rng.uniform(7, 30) * 3600
    onset = {"stalled": now - (rng.uniform(25, 100) * 60 if restarted else rng.uniform(2.2, 6) * 3600),
             "hung": now - rng.uniform(15, 100) * 60,
             "faulted": now + 120 if slot == 88 else now - 3600}.get(state, start)
    if state == "stalled" and not restarted:
        start = onset - 150  # launched, loaded its shards, then nothing
    bursts: list[tuple[float, float]] = []
    window = 1200.0
    k = math.floor(start / window)
    while k * window < horizon:
        begin = k * window + rng.uniform(0, 900)
        bursts.append((begin, begin + rng.uniform(30, 240)))
        k += 1
    node = Node(index, engine, state, onset, restarted, start, rng.uniform(0.55, 0.9), rng.uniform(2e3, 12e3),
                rng.randint(8, 64), [b for b in bursts if b[0] > start])
    total = 0.0
    for begin, end in node.bursts:
        node.burst_prefix.append(total)
        node.burst_ends.append(end)
        total += (end - begin) * BURST_UTIL
    if state == "faulted" and onset < now:
        node.reset_at = onset + RESET_AFTER
    rate = NOISE.get(state, 0.0)
    first, last = int(start // STEP), int(horizon // STEP)
    node.noise = [k for k in range(first, last) if rng.random() < rate]
    return node


def fleet(count: int, now: float, horizon: float) -> list[Node]:
    return [make_node(i, now, horizon) for i in range(count)]


# --- what a node reads at a time ----------------------------------------------------------------------------------

@dataclass
class At:
    """Node `node` at time `t`: every figure the value functions read."""
    t: float
    phase: str
    serving: bool  # the engine's own figures exist (it reached serving in this launch)
    util: float
    busy: float  # busy seconds per GPU since the server started
    memory: float  # per GPU
    power: float
    running: float
    waiting: float
    tokens: float
    stats_at: float  # the engine's last stats line (source "log")
    last_line: float
    progress: float
    lines: float
    probe_ok: bool
    refused: float
    timeouts: float
    last_success: float
    listening: float
    start: float
    phase_start: float
    events: dict[str, float]
    xid_at: float | None = None  # when its faulted GPU's Xid came (None: none yet)
    recovery: bool = False  # its faulted GPU's driver asks for a reset


def _bursts_busy(node: Node, t: float) -> tuple[float, bool, float]:
    """Busy seconds of the bursts up to `t`, whether a burst runs at `t`, and when the last one ended."""
    i = bisect.bisect_left(node.burst_ends, t)
    busy = node.burst_prefix[i] if i < len(node.bursts) else (
        node.burst_prefix[-1] + (node.bursts[-1][1] - node.bursts[-1][0]) * BURST_UTIL if node.bursts else 0.0)
    in_burst = i < len(node.bursts) and node.bursts[i][0] <= t
    if in_burst:
        busy += (t - node.bursts[i][0]) * BURST_UTIL
    last_end = node.bursts[i - 1][1] if i > 0 else node.start
    return busy, in_burst, last_end


def at(node: Node, t: float) -> At:
    now = _at(node, t)
    if node.state == "faulted" and t >= node.onset:
        now.xid_at, now.recovery = node.onset, t < node.reset_at
    return now


def _at(node: Node, t: float) -> At:
    step = int(t // STEP)
    timeouts = float(bisect.bisect_right(node.noise, step))
    blip = bool(node.noise) and timeouts > 0 and node.noise[int(timeouts) - 1] == step
    events = {"server_restart": 0.0, "stall_warning": 0.0}
    healthy_until = node.onset if node.state == "hung" else math.inf
    if node.state == "stalled" and t >= node.onset:
        return _stalled(node, t, events)
    if node.state in ("busy", "hung"):
        working_until = min(t, healthy_until)
        busy = node.util * (working_until - node.start)
        tokens = node.tokens_per_s * (working_until - node.start)
        hung = t >= healthy_until
        util = node.util
        running, waiting, stats_at = float(node.running), float(node.running // 4), t - t % 10
        last_line = stats_at
        if hung:
            spin = node.engine == "vllm"
            util = 1.0 if spin else 0.0
            busy += util * (t - healthy_until)
            running = 255.0 if node.engine == "vllm" else float(20 + node.index % 40)
            waiting = float(node.running // 4) + (t - healthy_until) / 30
            if node.engine == "vllm":  # its stats lines go on, and a warning a minute
                events["stall_warning"] = float(int((t - healthy_until) // 60))
            else:  # SGLang goes silent
                stats_at = last_line = healthy_until - healthy_until % 10
        lines = (last_line - node.start) / 10
        power = 90.0 if hung and util == 1.0 else 85 + 500 * util
        return At(t, "serving", True, util, busy, 76 * GB, power, running, waiting, tokens, stats_at, last_line,
                  last_line, lines, not blip, 0.0, timeouts, t if not blip else t - STEP, 1.0, node.start,
                  node.start + 300, events)
    # idle serving (and the relaunched stall before its relaunch)
    busy, in_burst, last_end = _bursts_busy(node, t)
    burst_seconds = busy / BURST_UTIL
    tokens = burst_seconds * 3000
    last_line = t - t % 10 if in_burst else last_end
    util = BURST_UTIL if in_burst else 0.0
    return At(t, "serving", True, util, busy, 76 * GB, 85 + 500 * util, 8.0 if in_burst else 0.0, 0.0, tokens,
              last_line, last_line, last_line, burst_seconds / 10, not blip, 0.0, timeouts,
              t if not blip else t - STEP, 1.0, node.start, node.start + 300, events)


def _stalled(node: Node, t: float, events: dict[str, float]) -> At:
    """The seed's signature from `node.onset` on: launched (a relaunch, when `restarted`), shards loaded in 150 s
    while the memory fills, then nothing: 0 %, log silent, probe refused, port closed, no engine figures."""
    before = at_idle_before(node) if node.restarted else None
    loaded = node.onset + 150
    memory = 76 * GB * min(1.0, max(0.0, (t - node.onset - 30) / 120))
    if node.restarted:
        events["server_restart"] = 1.0
    phase, phase_start = ("launching", node.onset) if t < node.onset + 30 else ("loading_weights", node.onset + 30)
    last_line = min(t, loaded)
    base_lines = before.lines if before else 0.0
    return At(t, phase, False, 0.0, before.busy if before else 0.0, memory, 85.0, 0.0, 0.0,
              before.tokens if before else 0.0, before.stats_at if before else node.start, last_line, last_line,
              base_lines + (last_line - node.onset) / 2, False, float(int((t - node.onset) // STEP)), 0.0,
              before.last_success if before else node.onset, 0.0, node.onset if node.restarted else node.start,
              phase_start, events)


def at_idle_before(node: Node) -> At:
    """The relaunched stall's figures just before its relaunch (its counters go on from there)."""
    return at(Node(**{**node.__dict__, "state": "idle"}), node.onset - 1e-3)


# --- series values ------------------------------------------------------------------------------------------------

Value = Callable[[At, dict[str, str], float], float | None]

PROBE_FAILURES: dict[str, Callable[[At], float]] = {"refused": lambda a: a.refused, "timeout": lambda a: a.timeouts}

VALUES: dict[str, Value] = {
    "gpu_utilization_ratio": lambda a, lab, v: a.util,
    "gpu_busy_seconds_total": lambda a, lab, v: a.busy,
    "gpu_memory_used_bytes": lambda a, lab, v: a.memory + 1e9,
    "server_gpu_memory_used_bytes": lambda a, lab, v: a.memory,
    "gpu_power_watts": lambda a, lab, v: a.power,
    "gpu_energy_joules_total": lambda a, lab, v: v + 300 * (a.t - a.start),
    "process_cpu_seconds_total": lambda a, lab, v: v + 0.02 * (a.t - a.start),
    "server_start_time_seconds": lambda a, lab, v: a.start,
    "startup_phase": lambda a, lab, v: float(lab["phase"] == a.phase),
    "startup_phase_start_timestamp_seconds": lambda a, lab, v: a.phase_start,
    "server_listening": lambda a, lab, v: a.listening,
    "probe_success": lambda a, lab, v: float(a.probe_ok),
    "probe_http_status_code": lambda a, lab, v: 200.0 if a.probe_ok else 0.0,
    "probe_duration_seconds": lambda a, lab, v: 0.004 if a.probe_ok else (0.0002 if a.refused else 5.0),
    "probe_last_success_timestamp_seconds": lambda a, lab, v: a.last_success,
    "probe_failures_total": lambda a, lab, v: PROBE_FAILURES.get(lab["reason"], lambda _: 0.0)(a),
    "log_size_bytes": lambda a, lab, v: 4e4 + 160 * a.lines,
    "log_read_bytes_total": lambda a, lab, v: 4e4 + 160 * a.lines,
    "log_lines_total": lambda a, lab, v: 300 + a.lines,
    "log_last_line_timestamp_seconds": lambda a, lab, v: a.last_line,
    "log_last_line_age_seconds": lambda a, lab, v: a.t - a.last_line,
    "log_last_progress_timestamp_seconds": lambda a, lab, v: a.progress,
    "log_events_total": lambda a, lab, v: a.events.get(lab["event"], 0.0),
    "engine_requests_running": lambda a, lab, v: a.running,
    "engine_requests_waiting": lambda a, lab, v: a.waiting,
    "engine_generated_tokens_total": lambda a, lab, v: a.tokens,
    "engine_stats_timestamp_seconds": lambda a, lab, v: a.t - a.t % 10 if lab["source"] == "metrics" else a.stats_at,
    "engine_metrics_up": lambda a, lab, v: 1.0,
    "gpu_xid_errors_total": lambda a, lab, v: None if a.xid_at is None else 1.0,
    "gpu_xid_last_timestamp_seconds": lambda a, lab, v: a.xid_at,
    "server_gpu_xid_last_timestamp_seconds": lambda a, lab, v: a.xid_at,
    "gpu_recovery_action": lambda a, lab, v: 1.0 if a.recovery and lab["gpu"] == FAULT_GPU else 0.0,
    "server_gpu_recovery_action": lambda a, lab, v: 1.0 if a.recovery else None,
}


def value(series: Series, labels: dict[str, str], now: At) -> float | None:
    """The series' value at `now`; None where the node does not have it then (no engine figures in a launch that
    never served)."""
    if series.family.startswith("engine_") and not now.serving:
        return None
    fn = VALUES.get(series.family)
    return fn(now, labels, series.value) if fn else series.value


# --- rendering ----------------------------------------------------------------------------------------------------

def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class Page:
    """One node's series, labelled as that node, ready to render at any time."""
    node: Node
    template: Template
    rows: list[tuple[str, Series, dict[str, str]]]  # (`name{labels} `, series, labels)


def node_labels(node: Node) -> Callable[[dict[str, str]], dict[str, str]]:
    """The node's own label values in place of the template's (the Kubernetes pod it runs in)."""
    rng = random.Random(f"labels-{node.index}")
    model = MODELS[node.engine][node.index % 3]
    deployment = f"{node.engine}-{model.split('/')[1].lower().replace('.', '-')}"
    pod = f"{deployment}-{rng.getrandbits(36):09x}-{rng.getrandbits(20):05x}"
    uid = "-".join(f"{rng.getrandbits(b * 4):0{b}x}" for b in (8, 4, 4, 4, 12))
    server = f"inference/{pod}"
    ip = f"10.{node.index // 250 % 250}.{node.index % 250}.{rng.randint(2, 250)}"
    uuid = f"GPU-{node.index:08x}-{rng.getrandbits(16):04x}-4000-8000-" + "{gpu:012d}"
    replace = {
        "server": server, "runtime": "kubernetes", "namespace": "inference", "pod": pod, "container": node.engine,
        "container_id": f"containerd://{rng.getrandbits(256):064x}", "unit": "", "model": model,
        "tensor_parallel": str(GPUS), "path": f"/var/log/pods/inference_{pod}_{uid}/{node.engine}/0.log",
    }
    local = re.compile(r"127\.0\.0\.1")

    def relabel(labels: dict[str, str]) -> dict[str, str]:
        out = dict(labels)
        for key in labels:
            if key in replace and not (key in ("model", "tensor_parallel") and "engine" not in labels):
                out[key] = replace[key]
        if "uuid" in out:
            out["uuid"] = uuid.format(gpu=int(out["gpu"]))
        if "url" in out:
            out["url"] = local.sub(ip, out["url"])
        return out

    return relabel


def page(node: Node, template: Template, target_labels: bool) -> Page:
    """`target_labels`: with the job and instance Prometheus adds to a scrape (the backfilled history's series)."""
    relabel = node_labels(node)
    rows = []
    for series in template.series:
        labels = relabel(dict(series.labels))
        shown = {**labels, "job": "stallwatch", "instance": node.instance} if target_labels else labels
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(shown.items()))
        rows.append((f"{PREFIX}{series.family}{{{text}}} " if text else f"{PREFIX}{series.family} ", series, labels))
    return Page(node, template, rows)


def exposition(p: Page, t: float) -> str:
    """The page at `t` in the text format the exporter serves (HELP and TYPE, no timestamps)."""
    now = at(p.node, t)
    out, seen = [], set()
    for prefix, series, labels in p.rows:
        v = value(series, labels, now)
        if v is None:
            continue
        if series.family not in seen:
            seen.add(series.family)
            out.append(p.template.headers[series.family])
        out.append(f"{prefix}{v!r}\n")
    return "".join(out)


def samples(p: Page, t: float) -> Iterator[str]:
    """The page at `t` as OpenMetrics sample lines with their timestamp (for `promtool tsdb create-blocks-from
    openmetrics`; no TYPE lines: the TSDB keeps none)."""
    now = at(p.node, t)
    stamp = f" {t:.3f}\n"
    for prefix, series, labels in p.rows:
        v = value(series, labels, now)
        if v is not None:
            yield f"{prefix}{v!r}{stamp}"


def catalog_gaps(found: dict[str, Template]) -> list[str]:
    """Catalog families no template has (another engine's, a multi-node deployment's, a fault's): not benched."""
    present = {s.family for tpl in found.values() for s in tpl.series}
    return sorted(set(CATALOG) - present)
