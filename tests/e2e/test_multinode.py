"""Multi-node deployments end to end: healthy idle ones stay silent; a lost rank or a node that never joins pages."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import pytest

from support import transcripts as t
from support.cluster import NODE_LOG_STALE, Cluster, require_nodes
from support.dashboard import DEPLOYMENT_ROW
from support.dashboard import queries as dashboard_queries
from support.harness import Engine, poll
from support.stack import PIPELINE, rule_seconds

WORKER_RANKS = [f"sglang::scheduler_TP{rank}" for rank in range(8, 16)]


SG_KEY = "10.77.0.1:20000"  # what every node of the SGLang deployment is given as --dist-init-addr


DP_KEY = "10.77.0.1:13345"  # the vLLM deployment's --data-parallel-address and rpc port


IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5}


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
        # The recording rule is evaluated a moment after the members' series it counts.
        poll(lambda: cluster.query("stallwatch:deployment_missing_nodes:count != 0") == [], timeout=30,
             what="no deployment missing a node")

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
        print(f"lost worker rank: paged {latency:.1f} s after the SIGKILL "
              f"(promise {rule_seconds('2m') + PIPELINE:g} s)")
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
              f"promise {bound:g} s)")
        assert latency >= NODE_LOG_STALE
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
        print(f"orphaned worker: ticket {latency:.1f} s after the head was killed (promise "
              f"{rule_seconds('10m') + rule_seconds('1m') + PIPELINE:g} s)")
        assert latency >= rule_seconds("10m")
        assert (ticket["labels"]["severity"], ticket["labels"]["deployment"], ticket["receiver"],
                ticket["group"]) == ("warning", DP_KEY, "tickets", {"deployment": DP_KEY})
        assert ticket["labels"]["instance"] == cluster.instance(1)
        assert {a["group"]["deployment"] for a in cluster.hook.alerts} == {DP_KEY}
        assert {a["labels"]["alertname"] for a in cluster.hook.alerts} <= {
            "InferenceDeploymentWorkerOrphaned", "InferenceServerDown"}
