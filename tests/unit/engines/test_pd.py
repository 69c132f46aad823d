"""PD roles and routers as engine data: each engine's role flag, and the members a router's command line lists."""

from __future__ import annotations

import pytest

from stallwatch.discovery.processes import invocation
from stallwatch.engines import ENGINES


@pytest.mark.parametrize(("name", "argv", "role"), [
    ("sglang", ["--disaggregation-mode", "prefill"], "prefill"),
    ("sglang", ["--disaggregation-mode=decode"], "decode"),
    ("sglang", ["--disaggregation-mode", "null"], ""),  # the default: no PD
    ("sglang", ["--tp", "8"], ""),
    ("vllm", ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'], "prefill"),
    ("vllm", ["--kv-transfer-config.kv_role", "kv_consumer"], "decode"),
    ("vllm", ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'], ""),
    ("vllm", ["--kv-transfer-config", "{not json"], ""),
    ("lmdeploy", ["serve", "api_server", "m", "--role", "Prefill"], "prefill"),
    ("lmdeploy", ["serve", "api_server", "m", "--role", "Hybrid"], ""),
    ("dynamo-vllm", ["-m", "dynamo.vllm", "--disaggregation-mode", "decode"], "decode"),
    ("dynamo-vllm", ["-m", "dynamo.vllm", "--is-prefill-worker"], "prefill"),
    ("dynamo-sglang", ["-m", "dynamo.sglang", "--disaggregation-mode", "agg"], ""),
    ("dynamo-trtllm", ["-m", "dynamo.trtllm", "--disaggregation-mode", "prefill"], "prefill"),
])
def test_a_servers_pd_role_is_read_from_its_command_line(name: str, argv: list[str], role: str) -> None:
    spec = ENGINES[name].disaggregation
    assert spec is not None and spec.role(argv) == role


def test_the_sglang_router_lists_its_prefills_with_their_bootstrap_ports_and_its_decodes() -> None:
    router = ENGINES["sglang_router"].router
    argv = ["--pd-disaggregation", "--prefill", "http://10.0.0.1:30000", "8998", "--prefill", "http://10.0.0.2:30000",
            "--decode", "http://10.0.0.3:30001", "--port", "8000"]
    assert router is not None
    assert router.members(argv) == [("prefill", "10.0.0.1", 30000), ("prefill", "10.0.0.2", 30000),
                                    ("decode", "10.0.0.3", 30001)]
    assert router.metrics_port(argv) == 29000
    assert router.metrics_port([*argv, "--prometheus-port", "29100"]) == 29100
    assert router.metrics_port([*argv, "--mini-lb"]) is None  # the mini_lb serves none


def test_the_vllm_toy_proxy_pairs_hosts_and_ports_and_has_defaults() -> None:
    router = ENGINES["vllm_proxy"].router
    assert router is not None
    assert router.members(["--prefiller-hosts", "a", "b", "--prefiller-ports", "8100", "8101", "--decoder-host", "c",
                           "--decoder-port", "8200"]) == [("prefill", "a", 8100), ("prefill", "b", 8101),
                                                          ("decode", "c", 8200)]
    assert router.members([]) == [("prefill", "localhost", 8100), ("decode", "localhost", 8200)]
    assert router.metrics_port([]) is None


@pytest.mark.parametrize(("argv", "name"), [
    (["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"], "sglang_router"),
    (["sglang::router"], "sglang_router"),  # its title once `launch_router` set it
    (["/usr/local/bin/smg", "--pd-disaggregation"], "sglang_router"),
    (["python", "-m", "sglang.srt.disaggregation.mini_lb", "--prefill", "http://p:30000"], "sglang_router"),
    (["python", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py", "--port", "8192"], "vllm_proxy"),
])
def test_routers_are_discovered_as_servers_of_their_own_kind(argv: list[str], name: str) -> None:
    found = [e.name for e in ENGINES.values() if e.program is not None and e.program.match(invocation(argv))]
    assert found == [name]


def test_a_router_is_never_probed_at_a_constant_health_endpoint() -> None:
    assert ENGINES["sglang_router"].health_path == "" and ENGINES["vllm_proxy"].health_path == ""


def test_a_router_serves_from_its_start_line() -> None:
    from stallwatch.logs.interpret import LogInterpreter

    interpreter = LogInterpreter(ENGINES["sglang_router"])
    interpreter.feed(b"2025-09-17T16:20:01.123456Z  INFO sglang_router_rs::server: src/server.rs:261: Starting router "
                     b"on 0.0.0.0:30000 | mode: PrefillDecode { prefill_urls: [(\"http://10.0.0.1:8000\", "
                     b"Some(8998))], decode_urls: [\"http://10.0.0.2:8000\"] }\n")
    assert interpreter.snapshot().phase == "serving"
