"""Deployments over several nodes, seen from one node: role, node rank, node count and the deployment key from the
command line and the LeaderWorkerSet environment (`discovery/deployment.py`), a worker's own log lines (its ready, no
shard bar, its silence), its rank processes, and the collector that exports them."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from stallwatch.discovery.deployment import MAX_KEY_CHARS, Member, membership, read_environ
from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter
from support import transcripts as t
from support.cluster import Node, ns_pid, require_nodes
from support.dashboard import DEPLOYMENT_ROW
from support.dashboard import queries as dashboard_queries
from support.harness import Engine, Exporter, gpus, poll
from support.stack import PIPELINE, Webhook, alertmanager, prometheus, rule_seconds

SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2-Instruct", "--tp", "16"]
VLLM = ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
LWS = {"LWS_LEADER_ADDRESS": "kimi-0.kimi.llm", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}


@pytest.mark.parametrize(("engine", "argv", "environ", "expected"), [
    # SGLang: `--nnodes --node-rank --dist-init-addr` (srt/arg_groups/fields/parallel.py), alias --nccl-init-addr.
    ("sglang", [*SGLANG, "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:20000"], {},
     Member("10.0.0.1:20000", "head", 0, 2)),
    ("sglang", [*SGLANG, "--nnodes=2", "--node-rank=1", "--nccl-init-addr=10.0.0.1:20000"], {},
     Member("10.0.0.1:20000", "worker", 1, 2)),
    # vLLM multi-node TP/PP: `--master-addr` (port 29501 by default), `--headless` on the other nodes.
    ("vllm", [*VLLM, "-tp", "8", "-pp", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
              "--headless"], {}, Member("10.0.0.1:29501", "worker", 1, 2)),
    # vLLM data parallel (docs/serving/data_parallel_deployment.md): 4 ranks, 2 per node.
    ("vllm", [*VLLM, "--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-address",
              "10.99.48.128", "--data-parallel-rpc-port", "13345"], {}, Member("10.99.48.128:13345", "head", 0, 2)),
    ("vllm", [*VLLM, "-dp", "4", "-dpl", "2", "--headless", "--data-parallel-start-rank", "2", "-dpa",
              "10.99.48.128", "-dpp", "13345"], {}, Member("10.99.48.128:13345", "worker", 1, 2)),
    # Under a LeaderWorkerSet the leader address joins the group, whatever the command line says (KServe resolves
    # it to an IP before exec: the cmdline and the environment differ).
    ("vllm", [*VLLM, "-dp", "2", "-dpl", "1", "--headless", "-dpr", "1", "-dpa", "10.1.2.3"], LWS,
     Member("kimi-0.kimi.llm", "worker", 1, 2)),
    ("sglang", [*SGLANG, "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "kimi-0.kimi.llm:20000"],
     {**LWS, "LWS_WORKER_INDEX": "0"}, Member("kimi-0.kimi.llm", "head", 0, 2)),
    ("sglang", [*SGLANG, "--nnodes", "2", "--dist-init-addr", "10.1.2.3:20000"], LWS,
     Member("kimi-0.kimi.llm", "worker", 1, 2)),
    # The environment alone makes no member: vLLM's head with its ranks as Ray actors (lws docs/examples/vllm),
    # whose worker pods run only `ray start --block`; an engine that never spans nodes.
    ("vllm", [*VLLM, "-tp", "8", "-pp", "2", "--distributed-executor-backend", "ray"], LWS, None),
    ("llamacpp", ["llama-server", "-m", "/models/q.gguf"], LWS, None),
    # One node: no member.
    ("sglang", SGLANG, {}, None),
    ("sglang", [*SGLANG, "--nnodes", "1", "--dist-init-addr", "10.0.0.1:20000"], {}, None),
    ("vllm", [*VLLM, "-dp", "2", "-dpl", "2", "-dpa", "10.0.0.1"], {}, None),
    ("sglang", SGLANG, {**LWS, "LWS_GROUP_SIZE": "1"}, None),
    ("tgi", ["text-generation-launcher", "--num-shard", "8"], {}, None),
    # Another user's argv: counts that are no counts, a rank past the node count, a key with quotes and newlines.
    ("sglang", [*SGLANG, "--nnodes", "99999999", "--dist-init-addr", "h:1"], {}, None),
    ("sglang", [*SGLANG, "--nnodes", "two", "--dist-init-addr", "h:1"], {}, None),
    ("sglang", [*SGLANG, "--nnodes", "2", "--node-rank", "7", "--dist-init-addr", "h:1"], {},
     Member("h:1", "head", 0, 2)),
    ("sglang", [*SGLANG, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", 'h"} or vector(1)\n:1'], {},
     Member("h___or_vector_1__:1", "worker", 1, 2)),
])
def test_membership_from_the_command_line_and_the_lws_environment(
    engine: str, argv: list[str], environ: dict[str, str], expected: Member | None
) -> None:
    assert membership(ENGINES[engine], argv, environ) == expected


def test_a_key_is_bounded() -> None:
    member = membership(ENGINES["sglang"], [*SGLANG, "--nnodes", "2", "--dist-init-addr", "h" * 100_000], {})
    assert member is not None and len(member.deployment) == MAX_KEY_CHARS


def test_environ_read_takes_only_the_lws_keys_bounded(tmp_path: Path) -> None:
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "environ").write_bytes(b"\0".join([
        b"PATH=/usr/bin", b"XLWS_LEADER_ADDRESS=decoy", b"LWS_LEADER_ADDRESSX=decoy", b"SECRET_TOKEN=hunter2",
        b"LWS_LEADER_ADDRESS=kimi-0.kimi.llm\xff", b"LWS_GROUP_SIZE=" + b"9" * 10_000, b"LWS_LEADER_ADDRESS=second",
        b"LWS_WORKER_INDEX=1", b""]))
    found = read_environ(str(tmp_path), 4242)
    assert found == {"LWS_LEADER_ADDRESS": "kimi-0.kimi.llm\ufffd", "LWS_GROUP_SIZE": "9" * MAX_KEY_CHARS,
                     "LWS_WORKER_INDEX": "1"}
    assert read_environ(str(tmp_path), 4343) == {}  # gone, or denied


def _phase_of(engine: str, log: str, worker: bool) -> LogInterpreter:
    chosen = ENGINES[engine].as_worker() if worker else ENGINES[engine]
    interpreter = LogInterpreter(chosen)
    interpreter.feed(log.encode())
    return interpreter


def test_an_sglang_worker_node_is_ready_at_its_dummy_health_server_without_a_shard_bar() -> None:
    """The real node-1 log: every local rank loads and captures, no shard bar (global rank 0 only), then the dummy
    health server; once node 0 went away its schedulers fail and it exits."""
    interpreter = _phase_of("sglang", t.real("sglang-worker-node.log"), worker=True)
    snap = interpreter.snapshot()
    assert (snap.phase, snap.shards_loaded, snap.shards_expected) == ("serving", None, None)
    assert interpreter.timeline() == ["launching", "loading_weights", "allocating_memory", "capturing_graphs",
                                      "serving"]
    interpreter.feed(t.real("sglang-worker-node-head-lost.log").encode())
    assert interpreter.snapshot().phase == "failed"
    assert interpreter.snapshot().events["fatal"] >= 1


def test_a_vllm_headless_node_is_ready_at_its_own_load_line_and_a_head_is_not() -> None:
    log = t.vllm_headless_dp(1, "10.99.48.128")
    assert _phase_of("vllm", log, worker=True).snapshot().phase == "serving"
    head = _phase_of("vllm", log, worker=False)  # the same lines on a single node are not its ready
    assert head.snapshot().phase == "warming_up"
    assert _phase_of("vllm", t.vllm_healthy(tp=2), worker=True).snapshot().phase == "serving"
    assert _phase_of("vllm", t.vllm_healthy(tp=2)[:t.vllm_healthy(tp=2).index("Model loading took")],
                     worker=False).snapshot().phase == "allocating_memory"


def _config(port: int, engine: str = "sglang") -> str:
    pattern = "sglang\\.launch_server" if engine == "sglang" else "vllm\\.entrypoints\\S*"
    return ("discovery: {enabled: false}\n"
            "defaults:\n  probe: {timeout: 1s, interval: 0.5s}\n"
            "logs: {poll_interval: 0.2s}\n"
            "servers:\n"
            f"  - name: member\n    engine: {engine}\n"
            f"    match: {{cmdline: '{pattern} .*--port {port}\\b'}}\n")


WORKER_RANKS = [f"sglang::scheduler_TP{rank}" for rank in range(8, 16)]


def test_a_worker_node_reports_its_deployment_and_the_rank_it_lost(exporter, engine) -> None:
    """SGLang node 1 of TP=16 over 2 nodes: schedulers TP8..TP15, no detokenizer, its dummy /health 200. A scheduler
    killed with SIGKILL leaves its parent (and the dummy) alive: 7 of the 8 ranks live, and the report says so."""
    sim = engine("sglang", t.sglang_worker_node(range(8, 16)), final="serve", tp=16, children=WORKER_RANKS,
                 http="dummy", args=("--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "198.18.0.2:20000"))
    e = exporter(config=_config(sim.port))
    member = {"server": "member", "deployment": "198.18.0.2:20000", "role": "worker", "node_rank": "1",
              "nnodes": "2"}
    scrape = e.wait_for(lambda s: s.value("stallwatch_deployment_member_ranks", server="member") == 8
                        and s.value("stallwatch_startup_phase", server="member", phase="serving") == 1 and s,
                        timeout=30, what="the worker node to be ready with 8 ranks")
    assert scrape.labelsets("stallwatch_deployment_member_info") == [member]
    assert scrape.value("stallwatch_deployment_member_info", **member) == 1
    assert [ls["node_rank"] for ls in scrape.labelsets("stallwatch_deployment_node_expected")] == ["0", "1"]
    assert scrape.value("stallwatch_probe_authoritative", server="member") == 0
    assert scrape.value("stallwatch_probe_success", server="member") == 1  # the dummy's constant 200
    assert scrape.samples("stallwatch_weight_shards_expected") == []  # no bar on node 1: not 0/n
    page = e.get("/servers/member")[1]
    assert "deployment 198.18.0.2:20000: node 1 of 2 (worker), 8 of 8 rank processes live" in page
    assert "HEALTHY: worker node 1 of 2 of deployment 198.18.0.2:20000" in page

    victim = next(p for p in psutil.Process(sim.proc.pid).children() if p.cmdline()[:1] == [WORKER_RANKS[3]])
    victim.send_signal(signal.SIGKILL)
    scrape = e.wait_for(lambda s: s.value("stallwatch_deployment_member_ranks", server="member") == 7 and s,
                        timeout=15, what="the lost rank")
    assert scrape.value("stallwatch_deployment_member_ranks_started", server="member") == 8
    assert scrape.value("stallwatch_server_up", server="member") == 1
    assert scrape.value("stallwatch_probe_success", server="member") == 1  # the dummy still says 200
    page = e.get("/servers/member")[1]
    assert "STALLED: worker node 1 of deployment 198.18.0.2:20000 has 7 of its 8 rank processes left" in page


def test_a_headless_vllm_node_under_a_leaderworkerset_is_a_worker_without_a_port(exporter, engine) -> None:
    """vLLM DP=2 over 2 pods of a LeaderWorkerSet: the worker's cmdline has the resolved IP, its environment the
    leader's name, which is the key. No API server: its port never listens."""
    sim = engine("vllm", t.vllm_headless_dp(1, "10.1.2.3"), final="serve", tp=1, http="none",
                 children=["VLLM::EngineCore_DP1"],
                 args=("--headless", "-dp", "2", "-dpl", "1", "-dpr", "1", "-dpa", "10.1.2.3", "-dpp", "13345"),
                 env={"LWS_LEADER_ADDRESS": "llama-0.llama.llm", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"})
    e = exporter(config=_config(sim.port, "vllm"))
    scrape = e.wait_for(lambda s: s.value("stallwatch_startup_phase", server="member", phase="serving") == 1 and s,
                        timeout=30, what="the headless node to be ready")
    assert scrape.labelsets("stallwatch_deployment_member_info") == [
        {"server": "member", "deployment": "llama-0.llama.llm", "role": "worker", "node_rank": "1", "nnodes": "2"}]
    assert scrape.value("stallwatch_deployment_member_ranks", server="member") == 1
    # Its derived probe is refused, as on any closed port, and says nothing: the head's judges.
    assert scrape.value("stallwatch_probe_authoritative", server="member") == 0
    assert scrape.value("stallwatch_server_listening", server="member", port=str(sim.port)) == 0


def test_a_single_node_server_has_no_deployment_series(exporter, engine) -> None:
    sim = engine("sglang", t.sglang_healthy(tp=2), final="serve", tp=2)
    e = exporter(config=_config(sim.port))
    scrape = e.wait_for(lambda s: s.value("stallwatch_startup_phase", server="member", phase="serving") == 1 and s,
                        timeout=30, what="the server to serve")
    assert not [name for name in scrape.families if "deployment" in name or "authoritative" in name]


# ---------------------------------------------------------------------------------------------------------------
# Nodes for real: each its own PID, mount and network namespace with its own engines, fake NVML and exporter; one
# real Prometheus scrapes every node's exporter with the shipped rules (time compressed, support.stack) and a real
# Alertmanager routes with the shipped deploy/prometheus/alertmanager.yml.

NODE_CONFIG = ("discovery: {enabled: true, interval: 1s}\n"
               "defaults:\n  stall: {gpu_memory_bytes: 70e9, log_stale: 12s}\n"
               "  probe: {timeout: 1s, interval: 1s}\n"
               "logs: {poll_interval: 0.5s}\n"
               "engine_metrics: {interval: 1s, timeout: 1s}\n")
NODE_LOG_STALE = 12.0  # seconds, as in NODE_CONFIG: at least the scaled idle window (5m -> 10 s)
SG_KEY = "10.77.0.1:20000"  # what every node of the SGLang deployment is given as --dist-init-addr
DP_KEY = "10.77.0.1:13345"  # the vLLM deployment's --data-parallel-address and rpc port
IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5}


class Cluster:
    """Nodes, each with an exporter; Prometheus over all of them; Alertmanager with the shipped routes."""

    def __init__(self, stack: contextlib.ExitStack, tmp: Path, daemons: list, count: int) -> None:
        self.stack, self.tmp = stack, tmp
        self.nodes = [stack.enter_context(contextlib.closing(Node(tmp, f"node{i}"))) for i in range(count)]
        self.gpus = [gpus(9, used=76e9, util=0) for _ in self.nodes]
        self.exporters = [self._exporter(node, nvml) for node, nvml in zip(self.nodes, self.gpus, strict=True)]
        self.hook = Webhook()
        am_port = alertmanager(daemons, tmp, self.hook, shipped=True)
        self.query = prometheus(daemons, tmp, am_port, [self.instance(i) for i in range(count)])
        poll(lambda: len(self.query('up{job="stallwatch"} == 1')) == count, timeout=30, what="every node scraped")

    def _exporter(self, node: Node, nvml: list[dict]) -> Exporter:
        e = Exporter(node.tmp, config=NODE_CONFIG, nvml={"gpus": nvml}, listen_host="0.0.0.0", prefix=node.prefix(),
                     url_host=node.address)
        self.stack.callback(e.stop)
        return e

    def instance(self, i: int) -> str:
        return f"{self.nodes[i].address}:{self.exporters[i].port}"

    def engine(self, i: int, *args: object, **kwargs: object) -> Engine:
        sim = Engine(self.nodes[i].tmp, *args, prefix=self.nodes[i].prefix(), **kwargs)  # type: ignore[arg-type]
        self.stack.callback(sim.stop)
        return sim

    def hold(self, i: int, titles: list[str], first_gpu: int = 0) -> list[psutil.Process]:
        """The processes titled `titles` on node `i` hold 75 GB each on GPUs `first_gpu`.. (pids as the node's
        NVML sees them: its own PID namespace's)."""
        def each() -> list[psutil.Process] | None:
            found = [self.nodes[i].titled(title) for title in titles]
            return [procs[0] for procs in found] if all(found) else None

        found = poll(each, timeout=30, what=f"{titles} on node {i}")
        for gpu, proc in enumerate(found, start=first_gpu):
            self.gpus[i][gpu]["processes"] = [{"pid": ns_pid(proc.pid), "used": 75e9}]
        self.exporters[i].nvml.update(gpus=self.gpus[i])
        return found

    def firing(self) -> list[dict]:
        """Alerts past their `for`: what pages or tickets. A pending one (a probe that timed out once while the
        node's 2 cores start 40 engine processes) is by design not yet anything."""
        return self.query('ALERTS{alertstate="firing"}')


def _sglang_node(cluster: Cluster, i: int) -> Engine:
    """Node `i` of SGLang TP=16 over 2 nodes: the head with its API (idle) and TP0..7, or node 1's TP8..15 with its
    dummy /health."""
    flags = ("--host", "0.0.0.0", "--nnodes", "2", "--node-rank", str(i), "--dist-init-addr", SG_KEY)
    if i == 0:
        return cluster.engine(0, "sglang", t.sglang_healthy(tp=8), final="serve", tp=16, port=30000,
                              args=flags, children=[f"sglang::scheduler_TP{r}" for r in range(8)]
                              + ["sglang::detokenizer"], work=dict(IDLE))
    return cluster.engine(1, "sglang", t.sglang_worker_node(range(8, 16)), final="serve", tp=16, port=30000,
                          args=flags, children=WORKER_RANKS, http="dummy")


def _vllm_node(cluster: Cluster, i: int, work: dict | None = None) -> Engine:
    """Node `i` of vLLM DP=2 over 2 nodes, one rank each: the head's API server (with `work`), or the headless
    node 1 (no port)."""
    flags = ("--host", "0.0.0.0", "-dp", "2", "-dpl", "1", "-dpa", DP_KEY.split(":")[0], "-dpp", DP_KEY.split(":")[1])
    if i == 0:
        return cluster.engine(0, "vllm", t.vllm_healthy(tp=1), final="serve", tp=1, port=8000,
                              args=flags, children=["VLLM::EngineCore_DP0"], work=work or dict(IDLE))
    return cluster.engine(1, "vllm", t.vllm_headless_dp(1, DP_KEY.split(":")[0]), final="serve", tp=1, port=8000,
                          args=(*flags, "--headless", "-dpr", "1"),
                          children=["VLLM::EngineCore_DP1"], http="none")


@pytest.mark.root
@pytest.mark.e2e
def test_healthy_idle_deployments_stay_silent_and_a_lost_worker_rank_pages_once(
    tmp_path: Path, daemons: list
) -> None:
    """SGLang TP=16 over 2 nodes without traffic and vLLM DP=2 with a headless node and the head's traffic: every
    worker's log silent, its GPUs full at 0 %, its port a dummy 200 or none, for many (scaled) idle windows: not
    one alert. Then a node-1 scheduler is killed with SIGKILL while its dummy /health stays 200: one page, in one
    notification group for the deployment."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 2)
        for i in (0, 1):
            _sglang_node(cluster, i)
            _vllm_node(cluster, i, work={"running": 3, "waiting": 0, "throughput": 400.0, "interval": 0.5})
        cluster.hold(0, [f"sglang::scheduler_TP{r}" for r in range(8)])
        ranks = cluster.hold(1, WORKER_RANKS)
        cluster.hold(0, ["VLLM::EngineCore_DP0"], first_gpu=8)
        cluster.hold(1, ["VLLM::EngineCore_DP1"], first_gpu=8)
        members = poll(lambda: (found := cluster.query("stallwatch_deployment_member_info")) and len(found) == 4
                       and found, timeout=30, what="four members")
        assert {(m["metric"]["deployment"], m["metric"]["role"], m["metric"]["node_rank"]) for m in members} == {
            (SG_KEY, "head", "0"), (SG_KEY, "worker", "1"), (DP_KEY, "head", "0"), (DP_KEY, "worker", "1")}
        poll(lambda: len(cluster.query('stallwatch_startup_phase{phase="serving"} == 1')) == 4, timeout=30,
             what="every member serving")
        assert cluster.query("stallwatch:deployment_missing_nodes:count != 0") == []

        # Idle for the scaled idle window, log_stale and the longest `for` of the worker-exempt alerts, twice over.
        quiet_until = time.monotonic() + 2 * (rule_seconds("5m") + NODE_LOG_STALE + rule_seconds("5m")) + PIPELINE
        while time.monotonic() < quiet_until:
            assert cluster.firing() == [], cluster.firing()
            time.sleep(1)
        assert cluster.hook.alerts == []
        empty = [title for title, expr in dashboard_queries(row=DEPLOYMENT_ROW) if not cluster.query(expr)]
        assert empty == [], f"deployment panels without data: {empty}"

        ranks[3].send_signal(signal.SIGKILL)
        killed = time.time()
        page = poll(lambda: next((a for a in cluster.hook.alerts if a["status"] == "firing"), None), timeout=60,
                    interval=0.2, what="the lost rank's page")
        latency = page["received_at"] - killed
        print(f"lost worker rank: paged {latency:.1f} s after the SIGKILL (bound {rule_seconds('2m') + PIPELINE:g} s)")
        assert latency <= rule_seconds("2m") + PIPELINE
        assert page["labels"]["alertname"] == "InferenceDeploymentMemberLost"
        assert (page["labels"]["severity"], page["labels"]["deployment"], page["receiver"], page["group"]) == (
            "critical", SG_KEY, "pager", {"deployment": SG_KEY})
        description = page["annotations"]["description"]
        assert f"node 1 of deployment {SG_KEY}, has 7 of its 8 rank processes left, while its head runs" in description
        assert "node 0 (head) sglang-30000 on" in description and "node 1 (worker) sglang-30000 on" in description
        # The dummy still answers 200 on node 1; nothing else fires, the vLLM deployment stays silent.
        assert cluster.query(f'stallwatch_probe_success{{instance="{cluster.instance(1)}",server="sglang-30000"}}'
                             )[0]["value"][1] == "1"
        time.sleep(rule_seconds("2m"))
        firing = {(a["metric"]["alertname"], a["metric"].get("deployment")) for a in cluster.firing()}
        assert firing == {("InferenceDeploymentMemberLost", SG_KEY)}
        assert {a["labels"]["alertname"] for a in cluster.hook.alerts} == {"InferenceDeploymentMemberLost"}
        assert {json.dumps(a["group"]) for a in cluster.hook.alerts} == {json.dumps({"deployment": SG_KEY})}


@pytest.mark.root
@pytest.mark.e2e
def test_a_node_that_never_joins_pages_within_log_stale_naming_it(tmp_path: Path, daemons: list) -> None:
    """Node 1's server never starts (a wrong --dist-init-addr, its pod pending): node 0 logs `Init parallel begin.`
    and nothing more. InferenceDeploymentIncomplete pages within log_stale + 2 (scaled) minutes of node 0's start,
    naming node rank 1, in the deployment's one notification group."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 2)
        started = time.time()
        cluster.engine(0, "sglang", t.sglang_head_waiting(tp=8), final="stall", tp=16, port=30000,
                       args=("--nnodes", "2", "--node-rank", "0", "--dist-init-addr", SG_KEY),
                       children=[f"sglang::scheduler_TP{r}" for r in range(8)] + ["sglang::detokenizer"])
        page = poll(lambda: next((a for a in cluster.hook.alerts
                                  if a["labels"]["alertname"] == "InferenceDeploymentIncomplete"), None),
                    timeout=90, interval=0.2, what="the incomplete deployment's page")
        latency = page["received_at"] - started
        bound = NODE_LOG_STALE + rule_seconds("2m") + PIPELINE
        print(f"node never joined: paged {latency:.1f} s after node 0 started (log_stale {NODE_LOG_STALE:g} s, "
              f"bound {bound:g} s)")
        assert NODE_LOG_STALE <= latency <= bound
        assert (page["labels"]["severity"], page["labels"]["deployment"], page["group"]) == (
            "critical", SG_KEY, {"deployment": SG_KEY})
        description = page["annotations"]["description"]
        assert f"Deployment {SG_KEY} is missing 1 node(s): node rank(s) 1 report nothing." in description
        assert f"node 0 (head) sglang-30000 on {cluster.instance(0)}: launching." in description
        assert {a["group"]["deployment"] for a in cluster.hook.alerts} == {SG_KEY}


@pytest.mark.root
@pytest.mark.e2e
def test_a_killed_head_leaves_its_worker_an_orphan_ticket(tmp_path: Path, daemons: list) -> None:
    """vLLM DP=2: the head is killed; the headless node stays and holds its GPU (vllm #32136). A ticket for the
    orphan, in the same notification group as the head's own InferenceServerDown."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 2)
        head = _vllm_node(cluster, 0)
        _vllm_node(cluster, 1)
        cluster.hold(0, ["VLLM::EngineCore_DP0"])
        cluster.hold(1, ["VLLM::EngineCore_DP1"])
        poll(lambda: len(cluster.query('stallwatch_startup_phase{phase="serving"} == 1')) == 2, timeout=30,
             what="both nodes serving")
        head.stop()
        killed = time.time()
        ticket = poll(lambda: next((a for a in cluster.hook.alerts
                                    if a["labels"]["alertname"] == "InferenceDeploymentWorkerOrphaned"), None),
                      timeout=90, interval=0.2, what="the orphan's ticket")
        latency = ticket["received_at"] - killed
        print(f"orphaned worker: ticket {latency:.1f} s after the head was killed (bound "
              f"{rule_seconds('10m') + rule_seconds('1m') + PIPELINE:g} s)")
        assert rule_seconds("10m") <= latency <= rule_seconds("10m") + rule_seconds("1m") + PIPELINE
        assert (ticket["labels"]["severity"], ticket["labels"]["deployment"], ticket["receiver"],
                ticket["group"]) == ("warning", DP_KEY, "tickets", {"deployment": DP_KEY})
        assert ticket["labels"]["instance"] == cluster.instance(1)
        assert {a["group"]["deployment"] for a in cluster.hook.alerts} == {DP_KEY}
        assert {a["labels"]["alertname"] for a in cluster.hook.alerts} <= {
            "InferenceDeploymentWorkerOrphaned", "InferenceServerDown"}
