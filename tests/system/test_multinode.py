"""Multi-node deployments through the exporter: membership, worker nodes and their lost ranks."""

from __future__ import annotations

import signal

import psutil
import pytest

from stallwatch.discovery.deployment import Member, membership
from stallwatch.discovery.workload import Workload
from stallwatch.engines import ENGINES
from support import transcripts as t

SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2-Instruct", "--tp", "16"]


VLLM = ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]


LWS = {"LWS_LEADER_ADDRESS": "kimi-0.kimi.llm", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
POD = Workload("kubernetes", "llm", "kimi-0-1", "sglang", "c" * 64)  # where the LWS keys are read


def _config(port: int, engine: str = "sglang") -> str:
    pattern = "sglang\\.launch_server" if engine == "sglang" else "vllm\\.entrypoints\\S*"
    return ("discovery: {enabled: false}\n"
            "defaults:\n  probe: {timeout: 1s, interval: 0.5s}\n"
            "logs: {poll_interval: 0.2s}\n"
            "servers:\n"
            f"  - name: member\n    engine: {engine}\n"
            f"    match: {{cmdline: '{pattern} .*--port {port}\\b'}}\n")


WORKER_RANKS = [f"sglang::scheduler_TP{rank}" for rank in range(8, 16)]


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
    # Under a LeaderWorkerSet (in its pods) the leader address joins the group, whatever the command line says
    # (KServe resolves it to an IP before exec: the cmdline and the environment differ).
    ("vllm", [*VLLM, "-dp", "2", "-dpl", "1", "--headless", "-dpr", "1", "-dpa", "10.1.2.3"], LWS,
     Member("kimi-0.kimi.llm@ns/llm", "worker", 1, 2)),
    ("sglang", [*SGLANG, "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "kimi-0.kimi.llm:20000"],
     {**LWS, "LWS_WORKER_INDEX": "0"}, Member("kimi-0.kimi.llm@ns/llm", "head", 0, 2)),
    ("sglang", [*SGLANG, "--nnodes", "2", "--dist-init-addr", "10.1.2.3:20000"], LWS,
     Member("kimi-0.kimi.llm@ns/llm", "worker", 1, 2)),
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
    assert membership(ENGINES[engine], argv, environ, POD if environ else Workload(), 0) == expected


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


def test_a_headless_vllm_node_is_a_worker_without_a_port(exporter, engine) -> None:
    """vLLM DP=2 over 2 nodes, the worker's cmdline with the resolved IP. No API server: its port never listens.
    The LWS keys in its environment are not read: a host process's environment is its own user's words (only a
    pod's are the LeaderWorkerSet's)."""
    sim = engine("vllm", t.vllm_headless_dp(1, "10.1.2.3"), final="serve", tp=1, http="none",
                 children=["VLLM::EngineCore_DP1"],
                 args=("--headless", "-dp", "2", "-dpl", "1", "-dpr", "1", "-dpa", "10.1.2.3", "-dpp", "13345"),
                 env={"LWS_LEADER_ADDRESS": "llama-0.llama.llm", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"})
    e = exporter(config=_config(sim.port, "vllm"))
    scrape = e.wait_for(lambda s: s.value("stallwatch_startup_phase", server="member", phase="serving") == 1 and s,
                        timeout=30, what="the headless node to be ready")
    assert scrape.labelsets("stallwatch_deployment_member_info") == [
        {"server": "member", "deployment": "10.1.2.3:13345", "role": "worker", "node_rank": "1", "nnodes": "2"}]
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
