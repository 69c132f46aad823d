"""Prefill/decode disaggregated groups end to end: a simulated 1P1D SGLang group with its router on a node of its own,
the real Prometheus with the shipped rules (time compressed) and the real Alertmanager with the shipped routes. A
healthy idle group raises nothing; a KV transfer that stops pages once for the group, naming the stage and the
members, before the engines' own 300 s abort; a decode whose prefill died pages as the peer lost. A vLLM group over
NIXL behind vLLM's toy proxy is found and judged by the same rules."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from support import transcripts as t
from support.cluster import Cluster, ns_pid, require_nodes
from support.dashboard import PD_ROW
from support.dashboard import queries as dashboard_queries
from support.harness import Engine, poll
from support.stack import PIPELINE, rule_seconds

# Idle, as the real engines are without traffic: nothing pending, the transfer counter where it stopped.
IDLE = {"running": 0, "waiting": 0, "throughput": 0.0, "tokens_start": 5000, "interval": 0.5, "pending": {},
        "transfers_start": 40, "transfers_rate": 0.0}
PREFILL, DECODE, PREFILL_2 = 30000, 30001, 30002
ROUTER = 8000


@dataclass(frozen=True)
class Flavor:
    """One engine's PD group: its members' launch lines, command lines by role, environment by port and stop, the
    title of the process that holds a member's GPU memory, and its router (none: the members' environment names
    the group): the router's command line and launch lines from the members' ports, and whether it serves its own
    view of its workers."""

    engine: str
    launch: dict[str, str]
    args: dict[str, tuple[str, ...]]
    stop: str
    holder: str
    env: Callable[[int], dict[str, str]] = lambda port: {}
    router: str = ""
    router_args: Callable[[tuple[int, ...], int], tuple[str, ...]] = lambda prefills, decode: ()
    router_launch: Callable[[tuple[int, ...], int], str] = lambda prefills, decode: ""
    router_view: bool = False


def _urls(ports: tuple[int, ...]) -> list[str]:
    return [f"http://127.0.0.1:{port}" for port in ports]


# SGLang's members with `--disaggregation-mode` behind sgl-router, which lists them on its command line and retitles
# itself `sglang::router`; the exporter reads its workers from its metrics page.
SGLANG = Flavor(
    engine="sglang",
    launch={"prefill": t.sglang_pd_bootstrap(tp=1), "decode": t.sglang_healthy(tp=1)},
    args={role: ("--host", "127.0.0.1", "--enable-metrics", "--disaggregation-mode", role)
          for role in ("prefill", "decode")},
    stop=t.sglang_sigterm_stop(),
    router="sglang_router",
    router_args=lambda prefills, decode: (*(arg for url in _urls(prefills) for arg in ("--prefill", url, "8998")),
                                          "--decode", *_urls((decode,))),
    router_launch=lambda prefills, decode: t.sglang_router_start([(url, 8998) for url in _urls(prefills)],
                                                                  _urls((decode,)), ROUTER),
    holder="sglang::scheduler",
    router_view=True,
)
# vLLM's members over NIXL (`kv_role` in `--kv-transfer-config`, docs/features/nixl_connector_usage.md) behind its toy
# proxy, which lists them as host and port lists and has no metrics page; each one's EngineCore holds the weights.
VLLM = Flavor(
    engine="vllm",
    launch={"prefill": t.vllm_healthy(tp=1), "decode": t.vllm_healthy(tp=1)},
    args={role: ("--host", "127.0.0.1", "--kv-transfer-config",
                 json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role}))
          for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer"))},
    stop=t.vllm_sigterm_stop(),
    router="vllm_proxy",
    router_args=lambda prefills, decode: ("--host", "127.0.0.1", "--prefiller-hosts", *["127.0.0.1"] * len(prefills),
                                          "--prefiller-ports", *map(str, prefills), "--decoder-hosts", "127.0.0.1",
                                          "--decoder-ports", str(decode)),
    router_launch=lambda prefills, decode: t.vllm_toy_proxy_start(len(prefills), 1, ROUTER),
    holder="VLLM::EngineCore",
)
# Dynamo's vLLM workers (`--disaggregation-mode`), grouped by their namespace and model (`DYN_NAMESPACE`), with no
# router the exporter watches (the frontend holds no model); each serves vLLM's page on its `DYN_SYSTEM_PORT`.
DYNAMO_VLLM = Flavor(
    engine="dynamo-vllm",
    launch={"prefill": t.dynamo_vllm_healthy(), "decode": t.dynamo_vllm_healthy()},
    args={role: ("--model", "Qwen/Qwen3-0.6B", "--disaggregation-mode", role) for role in ("prefill", "decode")},
    stop=t.dynamo_stop(),
    holder="VLLM::EngineCore",
    env=lambda port: {"DYN_NAMESPACE": "dynamo", "DYN_SYSTEM_PORT": str(port)},
)


class Group:
    """Prefills (`prefills`: their ports), a decode and their router of `flavor` on node `node`, each server's
    holder process holding a GPU of its own."""

    def __init__(self, cluster: Cluster, prefills: tuple[int, ...] = (PREFILL,), node: int = 0,
                 flavor: Flavor = SGLANG) -> None:
        self.cluster, self.node, self.flavor = cluster, node, flavor
        on = f'instance="{cluster.instance(node)}"'
        self.prefills = [self.start_prefill(port) for port in prefills]
        self.prefill = self.prefills[0]
        self.decode = cluster.engine(node, flavor.engine, flavor.launch["decode"], final="serve", tp=1, port=DECODE,
                                     args=flavor.args["decode"], env=flavor.env(DECODE), work=dict(IDLE),
                                     live_work=True)
        self.router = cluster.engine(node, flavor.router, flavor.router_launch(prefills, DECODE), final="serve",
                                     port=ROUTER, args=flavor.router_args(prefills, DECODE), work={"running": 0},
                                     live_work=True) if flavor.router else None
        self.hold_gpus(len(prefills) + 1)
        count = len(prefills) + 1 + (self.router is not None)
        # Each member's group once the router is read (an empty `pd_group` before: Prometheus drops the label).
        members = poll(lambda: (found := cluster.query(f'stallwatch_pd_member_info{{pd_group!="",{on}}}'))
                       and len(found) == count and found, timeout=30, what="the group's members")
        self.key = members[0]["metric"]["pd_group"]
        name = flavor.engine
        assert {(m["metric"]["pd_group"], m["metric"]["pd_role"], m["metric"]["server"]) for m in members} == {
            *((self.key, "prefill", f"{name}-{port}") for port in prefills), (self.key, "decode", f"{name}-{DECODE}"),
            *([(self.key, "router", self.router_name)] if self.router else [])}
        poll(lambda: len(cluster.query(f'stallwatch_startup_phase{{phase="serving",{on}}} == 1')) == count, timeout=30,
             what="the group serving")
        if flavor.router_view:  # the router's own view: every worker healthy
            poll(lambda: [w["value"][1] for w in cluster.query(f"stallwatch_router_worker_up{{{on}}}")]
                 == ["1"] * (count - 1), timeout=30, what="the router's view of its workers")

    def start_prefill(self, port: int) -> Engine:
        """A prefill server on `port`, idle once serving, that drains and exits on SIGTERM."""
        return self.cluster.engine(self.node, self.flavor.engine, self.flavor.launch["prefill"], final="serve", tp=1,
                                   port=port, args=self.flavor.args["prefill"], env=self.flavor.env(port),
                                   work=dict(IDLE), live_work=True, on_sigterm=self.flavor.stop)

    @property
    def router_name(self) -> str:
        on = f'instance="{self.cluster.instance(self.node)}"'
        found = self.cluster.query(f'stallwatch_pd_member_info{{pd_role="router",{on}}}')
        return found[0]["metric"]["server"] if found else ""

    def hold_gpus(self, servers: int) -> None:
        """Each server's holder (SGLang's `sglang::scheduler` at TP 1, vLLM's `VLLM::EngineCore`) holds 75 GB on a
        GPU of its own."""
        node = self.cluster.nodes[self.node]

        def holders() -> list[psutil.Process] | None:
            found = node.titled(self.flavor.holder)
            return found if len(found) == servers else None

        for gpu, proc in enumerate(poll(holders, timeout=30, what=f"every {self.flavor.holder}")):
            self.cluster.gpus[self.node][gpu]["processes"] = [{"pid": ns_pid(proc.pid), "used": 75e9}]
        self.cluster.exporters[self.node].nvml.update(gpus=self.cluster.gpus[self.node])

    def quiet(self, minutes: str) -> None:
        """Nothing fires for `minutes` of the rules' time."""
        until = time.monotonic() + rule_seconds(minutes)
        while time.monotonic() < until:
            assert self.cluster.firing() == [], self.cluster.firing()
            time.sleep(1)
        assert self.cluster.hook.alerts == []


def _pd_pages(cluster: Cluster) -> list[dict]:
    return [a for a in list(cluster.hook.alerts) if a["labels"]["alertname"].startswith("InferencePD")]


@pytest.mark.root
@pytest.mark.e2e
def test_an_idle_group_is_silent_and_a_transfer_that_stops_pages_once_for_the_group(tmp_path: Path,
                                                                                   daemons: list) -> None:
    """An idle 1P1D group and its router: every log silent, GPUs full at 0 %, both probes passing, for half an hour
    of scaled time: nothing. Then two requests stop in the KV transfer (the decode's `transfer` queue, the prefill's
    `inflight`, the router holding them, the transfer counter flat): InferencePDTransferStuck pages within 5 scaled
    minutes, in one notification group for the group, naming the stage and the members."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 1)
        group = Group(cluster)
        group.quiet("30m")
        empty = [title for title, expr in dashboard_queries(row=PD_ROW) if not cluster.query(expr)]
        assert empty == [], f"PD panels without data: {empty}"

        group.decode.update_work(pending={"transfer": 2})
        group.prefill.update_work(pending={"inflight": 2})
        group.router.update_work(running=2)
        stopped = time.time()
        page = poll(lambda: next((a for a in _pd_pages(cluster) if a["status"] == "firing"
                                  and a["labels"]["alertname"] == "InferencePDTransferStuck"), None),
                    timeout=60, interval=0.2, what="the stuck transfer's page")
        latency = page["received_at"] - stopped
        # The 3m window and the 1m `for` scale; scrape, evaluation and Alertmanager's wait (PIPELINE) do not. In real
        # time the same sum (4 minutes and a minute of pipeline at most) is under the engines' 300 s abort.
        bound = rule_seconds("4m") + PIPELINE
        print(f"transfer stuck: paged {latency:.1f} s after it stopped (promise {bound:g} s; the engines abort at "
              f"{rule_seconds('5m'):g} s of scaled time)")
        assert latency < bound
        assert (page["labels"]["severity"], page["labels"]["pd_group"], page["receiver"], page["group"]) == (
            "critical", group.key, "pager", {"pd_group": group.key})
        description = page["annotations"]["description"]
        assert f"PD group {group.key}: 2 or more requests have waited in {page['labels']['stage']}" in description
        assert f"decode sglang-{DECODE} on {cluster.instance(0)}, 2 in transfer" in description
        assert f"prefill sglang-{PREFILL} on {cluster.instance(0)}, 2 in inflight" in description
        assert f"router {group.router_name} on {cluster.instance(0)}" in description
        time.sleep(rule_seconds("2m"))
        firing = {(a["metric"]["alertname"], a["metric"].get("stage")) for a in cluster.firing()}
        assert firing == {("InferencePDTransferStuck", "transfer"), ("InferencePDTransferStuck", "inflight"),
                          ("InferencePDRouterNoProgress", None)}, firing
        # One notification group, the group's: every alert of it there, none per server.
        assert {tuple(a["group"].items()) for a in cluster.hook.alerts} == {(("pd_group", group.key),)}


@pytest.mark.root
@pytest.mark.e2e
@pytest.mark.parametrize("flavor", [VLLM, DYNAMO_VLLM], ids=["vllm-toy-proxy", "dynamo-vllm"])
def test_a_vllm_group_is_silent_idle_and_a_transfer_that_stops_pages_once(tmp_path: Path, daemons: list,
                                                                          flavor: Flavor) -> None:
    """vLLM 1P1D over NIXL (`kv_producer`, `kv_consumer`) behind vLLM's toy proxy, which has no metrics page, the
    group the proxy's host lists; and Dynamo's vLLM workers, the group their namespace and model. Idle for 10 scaled
    minutes it raises nothing. Then the decode's two KV fetches stay `in_progress` (NIXL's transfer count flat,
    nothing running on the prefill, which finished its part before the proxy sent the request on):
    InferencePDTransferStuck pages once, for the group, in stage transfer, within 5 scaled minutes (issue 29)."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 1)
        group = Group(cluster, flavor=flavor)
        group.quiet("10m")

        group.decode.update_work(pending={"transfer": 2})
        stopped = time.time()
        page = poll(lambda: next((a for a in _pd_pages(cluster) if a["status"] == "firing"), None), timeout=60,
                    interval=0.2, what="the stuck transfer's page")
        latency = page["received_at"] - stopped
        bound = rule_seconds("4m") + PIPELINE
        print(f"vLLM transfer stuck: paged {latency:.1f} s after it stopped (promise {bound:g} s)")
        assert latency < bound
        assert (page["labels"]["alertname"], page["labels"]["stage"], page["labels"]["pd_group"], page["group"]) == (
            "InferencePDTransferStuck", "transfer", group.key, {"pd_group": group.key})
        description = page["annotations"]["description"]
        assert f"decode {flavor.engine}-{DECODE} on {cluster.instance(0)}, 2 in transfer;" in description
        assert f"prefill {flavor.engine}-{PREFILL} on {cluster.instance(0)}" in description
        time.sleep(rule_seconds("1m"))
        assert [a["metric"]["alertname"] for a in cluster.firing()] == ["InferencePDTransferStuck"]
        # One page: every notification the group's, of this one alert.
        assert {(a["labels"]["alertname"], a["labels"].get("stage"), tuple(a["group"].items()))
                for a in cluster.hook.alerts} == {("InferencePDTransferStuck", "transfer", (("pd_group", group.key),))}


@pytest.mark.root
@pytest.mark.e2e
def test_idle_1p1d_and_2p1d_groups_on_two_nodes_are_silent_for_two_hours(tmp_path: Path, daemons: list) -> None:
    """A 1P1D group with its router on one node, a 2P1D group with its router on another (each router on port 8000 of
    its node, so only the node tells their groups apart), every member idle as the real engines are without traffic:
    nothing fires for two hours of the rules' time (issue 29)."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 2)
        one = Group(cluster)
        two = Group(cluster, (PREFILL, PREFILL_2), node=1)
        assert one.key != two.key
        print(f"idle for {rule_seconds('2h'):g} s: groups {one.key} (1P1D) and {two.key} (2P1D)")
        one.quiet("2h")
        assert len(cluster.query('stallwatch_startup_phase{phase="serving"} == 1')) == 7  # every member still serves


@pytest.mark.root
@pytest.mark.e2e
def test_a_decode_whose_prefill_died_pages_as_peer_lost(tmp_path: Path, daemons: list) -> None:
    """The prefill server is killed; the decode side's heartbeat to its bootstrap server misses twice and it logs
    `Lost connection with prefill instance ..., 2 requests affected` (appended to its log as SGLang prints it).
    InferencePDPeerLost pages within 2 scaled minutes, for the group, naming the prefill as gone."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 1)
        group = Group(cluster)
        group.quiet("5m")
        group.prefill.stop()  # SIGKILL to its whole process group
        killed = time.time()
        with open(group.decode.log, "a") as log:
            log.write(t.sglang_lost_prefill("127.0.0.1:8998", 2))
        page = poll(lambda: next((a for a in _pd_pages(cluster) if a["status"] == "firing"), None), timeout=60,
                    interval=0.2, what="the lost peer's page")
        latency = page["received_at"] - killed
        print(f"peer lost: paged {latency:.1f} s after the prefill was killed "
              f"(promise {rule_seconds('2m') + PIPELINE:g} s)")
        assert page["labels"]["alertname"] == "InferencePDPeerLost"
        assert (page["labels"]["severity"], page["labels"]["pd_group"], page["labels"]["server"], page["group"]) == (
            "critical", group.key, f"sglang-{DECODE}", {"pd_group": group.key})
        description = page["annotations"]["description"]
        assert "and 1 member(s) of its group have no process left" in description
        assert f"prefill sglang-{PREFILL} on {cluster.instance(0)} (its process gone)" in description


@pytest.mark.root
@pytest.mark.e2e
def test_a_2p1d_group_is_silent_idle_and_while_its_decode_waits_on_a_long_prefill(tmp_path: Path,
                                                                                  daemons: list) -> None:
    """Two prefills, one decode and the router, idle for 10 scaled minutes; then SGLang's dual dispatch on one long
    prompt: the decode waits in `transfer` for 4 scaled minutes while the first prefill runs the prompt (no token of
    its own, the transfer counter flat, the router holding the request), and then the KV arrives and it decodes.
    Nothing fires throughout, nor 3 minutes after."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 1)
        group = Group(cluster, (PREFILL, PREFILL_2))
        group.quiet("10m")
        group.prefill.update_work(running=1)
        group.decode.update_work(pending={"transfer": 1})
        group.router.update_work(running=1)
        group.quiet("4m")
        group.prefill.update_work(running=0)
        group.decode.update_work(pending={}, running=1, throughput=40.0, transfers_rate=0.5)
        group.quiet("1m")
        group.decode.update_work(running=0, throughput=0.0, transfers_rate=0.0)
        group.router.update_work(running=0)
        group.quiet("3m")


@pytest.mark.root
@pytest.mark.e2e
def test_a_rollout_of_one_prefill_raises_nothing(tmp_path: Path, daemons: list) -> None:
    """A 2P1D group, idle; then its second prefill is rolled: SIGTERM (it drains and exits, as in a rolling update),
    a new one on its port a few seconds later that loads, warms up and serves, its scheduler on the GPU the old one
    held. The group is one prefill short meanwhile, never without its role: nothing fires, before, during or for
    10 scaled minutes after (issue 29: a rollout of one side raises nothing that pages)."""
    require_nodes()
    with contextlib.ExitStack() as stack:
        cluster = Cluster(stack, tmp_path, daemons, 1)
        group = Group(cluster, (PREFILL, PREFILL_2))
        group.quiet("5m")
        old = group.prefills[1]
        # SIGTERM to the server, not to the `nsenter` that forked it into the node; it exits with it.
        psutil.Process(old.proc.pid).children()[0].send_signal(signal.SIGTERM)
        old.proc.wait(30)
        cluster.gpus[0][1]["processes"] = []  # its memory freed with it
        cluster.exporters[0].nvml.update(gpus=cluster.gpus[0])
        poll(lambda: cluster.query(f'stallwatch_startup_phase{{server="{old.name}",phase="stopped"}} == 1'),
             timeout=30, what="the old prefill stopped")
        group.prefills[1] = group.start_prefill(PREFILL_2)
        group.hold_gpus(3)
        poll(lambda: len(cluster.query('stallwatch_startup_phase{phase="serving"} == 1')) == 4, timeout=60,
             what="the new prefill serving beside the group")
        group.quiet("10m")
