"""Configs for the tests: the contract's example (`GOOD`), the parser with the registered collectors' sections,
and `stallwatch check-config` as a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stallwatch import config
from stallwatch.collectors import sections

# Discovery, probes and log polling fast enough that each test takes seconds; a gone server is forgotten after 1 s.
FAST = ("discovery: {enabled: true, interval: 0.2s, forget_after: 1s}\n"
        "defaults: {probe: {interval: 0.2s, timeout: 1s}}\nlogs: {poll_interval: 0.1s}\n")
# The same, remembering a gone server's name for 30 s: what a test of who takes that name needs.
FAST_REMEMBERING = FAST.replace("forget_after: 1s", "forget_after: 30s")

# An engine's own pages and probes read every 0.3 s: a system test of one engine's figures.
ENGINE_PAGES = ("discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
                "defaults:\n  probe: {timeout: 1s, interval: 0.3s}\n"
                "engine_metrics: {interval: 0.3s, timeout: 1s}\n")


def end_to_end(log_stale: str = "3s") -> str:
    """The exporter's config for an end-to-end test of one engine under the shortened rules: 70 GB is loaded, the
    log is stale after `log_stale`, probes and pages every second."""
    return ("discovery: {enabled: true, interval: 1s}\n"
            f"defaults:\n  stall: {{gpu_memory_bytes: 70e9, log_stale: {log_stale}}}\n"
            "  probe: {timeout: 1s, interval: 1s}\n"
            "logs: {poll_interval: 0.5s}\n"
            "engine_metrics: {interval: 1s, timeout: 1s}\n")


GOOD = """\
servers:
  - name: kimi-eagle3
    engine: sglang
    match:
      cmdline: 'sglang\\.launch_server'
    logs: [/data/eagle3/logs/sglang.log]
    probes:
      - url: http://127.0.0.1:30000/health
        timeout: 5s
        interval: 15s
    gpus: auto
    stall:
      gpu_memory_bytes: 70e9
      log_stale: 10m
gpu: {enabled: true}
"""


def parse(text: str, file: str = "<config>") -> config.Config:
    return config.parse(text, sections(), file)


def check_config(tmp_path: Path, text: str | None, name: str = "c.yml") -> subprocess.CompletedProcess[str]:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    return subprocess.run([sys.executable, "-m", "stallwatch", "check-config", str(path)],
                          capture_output=True, text=True, timeout=30)
