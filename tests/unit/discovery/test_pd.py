"""PD groups: a member's key in order of trust (configured, the Dynamo graph, the Dynamo namespace and model, a router
on the node that lists it), and no group where nothing says."""

from __future__ import annotations

from stallwatch.discovery.pd import PdPlace, Seen, groups, place
from stallwatch.engines import ENGINES

SGLANG = ENGINES["sglang"]
PREFILL = ["--disaggregation-mode", "prefill", "--port", "30000"]
DYNAMO = {"DYN_PARENT_DGD_K8S_NAMESPACE": "llm", "DYN_PARENT_DGD_K8S_NAME": "kimi-disagg", "DYN_NAMESPACE": "llm-kimi"}


def test_the_key_is_taken_in_order_of_trust() -> None:
    assert place(SGLANG, PREFILL, DYNAMO, "kimi", "m") == PdPlace("prefill", "kimi")
    assert place(SGLANG, PREFILL, DYNAMO, None, "m") == PdPlace("prefill", "llm/kimi-disagg")
    assert place(SGLANG, PREFILL, {"DYN_NAMESPACE": "llm-kimi"}, None, "moonshotai/Kimi-K2") == PdPlace(
        "prefill", "llm-kimi/moonshotai/Kimi-K2")
    assert place(SGLANG, PREFILL, {}, None, "m") == PdPlace("prefill", "")
    assert place(SGLANG, ["--tp", "8"], DYNAMO, "kimi", "m") is None  # no PD role: no member, whatever else says


def test_a_key_from_the_environment_is_cut_to_address_characters() -> None:
    found = place(SGLANG, PREFILL, {"DYN_NAMESPACE": 'x"} or vector(1)'}, None, "m")
    assert found is not None and '"' not in found.key and " " not in found.key


def _router(*members: tuple[str, str, int], key: str = "") -> PdPlace:
    return PdPlace("router", key, members)


def test_a_router_on_the_node_groups_the_members_it_lists_and_only_those() -> None:
    seen = [Seen("p", PdPlace("prefill"), "127.0.0.1", 30000), Seen("d", PdPlace("decode"), "0.0.0.0", 30001),
            Seen("elsewhere", PdPlace("decode"), "0.0.0.0", 30002),
            Seen("router", _router(("prefill", "127.0.0.1", 30000), ("decode", "localhost", 30001)), "0.0.0.0", 8000)]
    assert groups(seen, "node-a") == {"p": ("node-a/router", "prefill"), "d": ("node-a/router", "decode"),
                                      "router": ("node-a/router", "router"), "elsewhere": ("", "decode")}


def test_a_router_whose_flags_are_gone_reads_its_members_from_its_metrics_page() -> None:
    seen = [Seen("p", PdPlace("prefill"), "127.0.0.1", 30000),
            Seen("router", _router(), "0.0.0.0", 8000, workers=("http://127.0.0.1:30000",))]
    assert groups(seen, "n")["p"] == ("n/router", "prefill")


def test_a_router_joins_the_group_its_members_are_configured_in_and_a_remote_host_is_not_a_member() -> None:
    seen = [Seen("p", PdPlace("prefill", "kimi"), "127.0.0.1", 30000), Seen("d", PdPlace("decode"), "0.0.0.0", 30001),
            Seen("router", _router(("prefill", "127.0.0.1", 30000), ("decode", "10.0.0.9", 30001)), "0.0.0.0", 8000)]
    assert groups(seen, "n") == {"p": ("kimi", "prefill"), "d": ("", "decode"), "router": ("kimi", "router")}


def test_a_configured_role_stands_before_the_command_lines() -> None:
    """llm-d runs vLLM with `kv_both` and says the side in a pod label only: a configured `pd_role` makes the server a
    member of that side, and outranks what its command line says; a router stays a router."""
    vllm = ENGINES["vllm"]
    both = ["vllm", "serve", "m", "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
    assert place(vllm, both, {}, "llm/kimi", "m", "decode") == PdPlace("decode", "llm/kimi")
    assert place(SGLANG, PREFILL, {}, None, "m", "decode") == PdPlace("decode", "")
    assert place(vllm, ["vllm", "serve", "m"], {}, "llm/kimi", "m", "prefill") == PdPlace("prefill", "llm/kimi")
    router = place(ENGINES["vllm_proxy"], ["--prefiller-hosts", "h"], {}, None, "", "decode")
    assert router is not None and router.role == "router"


def test_a_vllm_kv_both_server_takes_its_role_from_the_proxys_lists() -> None:
    """NixlConnector ignores `kv_role` (the usage doc's own example is `kv_both`): the toy proxy's lists say which
    server prefills; a `kv_both` server no router lists has no role, and a server without a KV connector is none."""
    vllm, proxy = ENGINES["vllm"], ENGINES["vllm_proxy"]
    both = place(vllm, ["vllm", "serve", "m", "--port", "8100", "--kv-transfer-config",
                        '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'], {}, None, "m")
    assert both == PdPlace("", "")
    assert place(vllm, ["vllm", "serve", "m", "--port", "8000"], {}, None, "m") is None
    router = place(proxy, ["--prefiller-hosts", "localhost", "--prefiller-ports", "8100", "--decoder-hosts",
                           "localhost", "--decoder-ports", "8200"], {}, None, "")
    assert router is not None and both is not None
    seen = [Seen("p", both, "0.0.0.0", 8100), Seen("d", both, "0.0.0.0", 8200), Seen("lone", both, "0.0.0.0", 8300),
            Seen("proxy", router, "127.0.0.1", 8000)]
    assert groups(seen, "n") == {"p": ("n/proxy", "prefill"), "d": ("n/proxy", "decode"), "lone": ("", ""),
                                 "proxy": ("n/proxy", "router")}
