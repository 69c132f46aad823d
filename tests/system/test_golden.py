"""The golden scrapes, byte for byte after masking values: every family and label the exporter writes (the 2-GPU
one, every collector's details on), and what a TP=8 node whose 8 GPUs report every health field exports by default
(the 8-GPU one, which holds the series budget)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stallwatch.collectors.catalog import CATALOG
from support import transcripts as t
from support.harness import Scrape, gpus, poll
from support.paths import ROOT

GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "scrape.prom"
GOLDEN_8GPU = ROOT / "tests" / "fixtures" / "golden" / "scrape-8gpu.prom"
# Series an 8-GPU TP=8 node with every health field may export by default (issue 31: ~330 before the budget).
SERIES_BUDGET = 150
# Every health field a data-centre GPU reports, healthy: no recovery action, no ECC error, no remap pending.
HEALTH = {"power": 120.0, "power_limit": 700.0, "energy": 5e6, "recovery_action": 0, "ecc_uncorrected": 0,
          "remapped_rows": [0, 0, 0, 0], "pcie_replays": 0, "clock_reasons": 0x1}


MASKED = (  # families whose values depend on time, scheduling or the machine
    "stallwatch_collector_duration_seconds",
    "stallwatch_process_cpu_seconds_total",
    "stallwatch_process_resident_memory_bytes",
    "stallwatch_process_threads",
    "stallwatch_server_processes",
    "stallwatch_server_start_time_seconds",
    "stallwatch_startup_phase_start_timestamp_seconds",
    "stallwatch_log_last_line_timestamp_seconds",
    "stallwatch_log_last_progress_timestamp_seconds",
    "stallwatch_log_last_line_age_seconds",
    "stallwatch_probe_duration_seconds",
    "stallwatch_probe_failures_total",
)


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})? (?P<value>\S+)$")


def masked(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    out = []
    for line in text.splitlines():
        sample = SAMPLE.match(line)
        if sample and sample.group("name") in MASKED:
            line = f"{sample.group('name')}{sample.group('labels') or ''} <masked>"
        out.append(line)
    return "\n".join(out) + "\n"


def settled(scrape: Scrape, size: int, tp: int) -> bool:
    roles = {ls["process"] for ls in scrape.labelsets("stallwatch_process_cpu_seconds_total")}
    return (scrape.value("stallwatch_startup_phase", server="golden", phase="loading_weights") == 1
            and scrape.value("stallwatch_weight_shards_loaded", server="golden") == 64
            and scrape.value("stallwatch_log_last_line_age_seconds", server="golden") is not None
            and scrape.value("stallwatch_probe_success", server="golden") == 0
            # `python` is multiprocessing's resource tracker, as in the real engine
            and roles == {"main", *(f"scheduler_TP{i}" for i in range(tp)), "detokenizer", "python"}
            and len(scrape.samples("stallwatch_server_gpu_busy_seconds_total")) == tp)


def golden_scrape(exporter, engine, tmp_path: Path, tp: int, health: dict, details: bool = False) -> str:
    """The seed stall at TP=`tp` on `tp` GPUs, each with `health`, scraped once it settles, values masked; with
    the exporter's defaults, or with every collector's details (`--collector.<name>.details`)."""
    transcript = t.sglang_until_shards(tp=tp, shards=64)
    sim = engine("sglang", transcript, final="stall", tp=tp, log_name="sglang.log")
    size = len(transcript.encode())
    # The whole log is written before the exporter starts: it is recovered, not read as new lines.
    poll(lambda: sim.log.stat().st_size == size, what="the simulated engine to write its log")
    e = exporter(nvml={"driver": "550.54.15", "gpus": gpus(tp, used=76e9, util=0, **health)}, details=details, config=(
        "discovery: {enabled: false}\n"
        "defaults:\n  probe: {timeout: 1s, interval: 1s}\n"
        "logs: {poll_interval: 0.2s}\n"
        "servers:\n"
        "  - name: golden\n    engine: sglang\n"
        f"    match: {{cmdline: 'sglang\\.launch_server .*--port {sim.port}\\b'}}\n"
        f"    gpus: [{', '.join(map(str, range(tp)))}]\n    stall: {{gpu_memory_bytes: 70GB, log_stale: 5m}}\n"))
    scrape = e.wait_for(lambda s: settled(s, size, tp) and s, timeout=30, what="the scenario to settle")
    return masked(scrape.text, {str(tmp_path): "<tmp>", f":{sim.port}/": ":<port>/",
                                f'port="{sim.port}"': 'port="<port>"'})


def check_golden(got: str, golden: Path, request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--update-golden"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got)
    assert got == golden.read_text(), f"scrape differs from {golden.relative_to(ROOT)} (--update-golden)"


def series(text: str) -> list[str]:
    return [line for line in text.splitlines() if SAMPLE.match(line)]


def test_golden_scrape(exporter, engine, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    check_golden(golden_scrape(exporter, engine, tmp_path, tp=2, health={}, details=True), GOLDEN, request)


def test_golden_8gpu_scrape_holds_the_series_budget(exporter, engine, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    """An 8-GPU TP=8 node whose GPUs report every health field exports at most SERIES_BUDGET series by default."""
    got = golden_scrape(exporter, engine, tmp_path, tp=8, health=HEALTH)
    check_golden(got, GOLDEN_8GPU, request)
    assert len(series(got)) <= SERIES_BUDGET, f"{len(series(got))} series, budget {SERIES_BUDGET}"


def test_each_detail_family_comes_back_with_its_collectors_details(exporter, engine, tmp_path: Path) -> None:
    """Every family the budget leaves out (catalog `detail`) is exported with its collector's details on, and none
    of them without (the 8-GPU golden scrape's defaults)."""
    details = {f"stallwatch_{name}" for name, spec in CATALOG.items() if spec.detail}
    # The stalled server's probe never succeeded: test_exporter's probe tests read it, with details on.
    details.discard("stallwatch_probe_last_success_timestamp_seconds")
    default = families(GOLDEN_8GPU.read_text())
    assert not default & details, "detail families in the default scrape"
    got = families(golden_scrape(exporter, engine, tmp_path, tp=8, health=HEALTH, details=True))
    assert got >= details, f"not exported with details on: {sorted(details - got)}"
    assert got - details == default, "the details flags change the default families"


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
