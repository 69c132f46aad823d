"""The golden scrape: every family and label the exporter writes, byte for byte after masking values."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import transcripts as t
from support.harness import Scrape, gpus, poll
from support.paths import ROOT

GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "scrape.prom"


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


def settled(scrape: Scrape, size: int) -> bool:
    roles = {ls["process"] for ls in scrape.labelsets("stallwatch_process_threads")}
    return (scrape.value("stallwatch_startup_phase", server="golden", phase="loading_weights") == 1
            and scrape.value("stallwatch_weight_shards_loaded", server="golden") == 64
            and scrape.value("stallwatch_log_size_bytes", server="golden") == size
            and scrape.value("stallwatch_probe_success", server="golden") == 0
            # `python` is multiprocessing's resource tracker, as in the real engine
            and roles == {"main", "scheduler_TP0", "scheduler_TP1", "detokenizer", "python"}
            and len(scrape.samples("stallwatch_gpu_busy_seconds_total")) == 2)


def test_golden_scrape(exporter, engine, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    transcript = t.sglang_until_shards(tp=2, shards=64)
    sim = engine("sglang", transcript, final="stall", tp=2, log_name="sglang.log")
    size = len(transcript.encode())
    # The whole log is written before the exporter starts: it is recovered, not read as new lines.
    poll(lambda: sim.log.stat().st_size == size, what="the simulated engine to write its log")
    e = exporter(nvml={"driver": "550.54.15", "gpus": gpus(2, used=76e9, util=0)}, config=(
        "discovery: {enabled: false}\n"
        "defaults:\n  probe: {timeout: 1s, interval: 1s}\n"
        "logs: {poll_interval: 0.2s}\n"
        "servers:\n"
        "  - name: golden\n    engine: sglang\n"
        f"    match: {{cmdline: 'sglang\\.launch_server .*--port {sim.port}\\b'}}\n"
        "    gpus: [0, 1]\n    stall: {gpu_memory_bytes: 70GB, log_stale: 5m}\n"))
    scrape = e.wait_for(lambda s: settled(s, size) and s, timeout=30, what="the scenario to settle")
    got = masked(scrape.text, {str(tmp_path): "<tmp>", f":{sim.port}/": ":<port>/",
                               f'port="{sim.port}"': 'port="<port>"'})
    if request.config.getoption("--update-golden"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "scrape differs from tests/fixtures/golden/scrape.prom (--update-golden)"
