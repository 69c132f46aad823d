"""Config validation through the CLI (`stallwatch check-config`) and the parser behind it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stallwatch.config.reader import ConfigError
from stallwatch.config.units import parse_duration, parse_size
from support.configs import GOOD, check_config, parse


@pytest.mark.process
def test_design_example_is_valid(tmp_path: Path) -> None:
    result = check_config(tmp_path, GOOD)
    assert result.returncode == 0, result.stderr
    config = parse(GOOD)
    server = config.servers[0]
    assert server.name == "kimi-eagle3" and server.gpus is None
    assert server.stall.gpu_memory_bytes == 70e9 and server.stall.log_stale == 600
    assert server.probes and server.probes[0].timeout == 5 and server.probes[0].interval == 15
    assert config.discovery.enabled is False  # servers listed: only those are watched unless discovery is enabled


@pytest.mark.process
def test_empty_file_is_the_default_config(tmp_path: Path) -> None:
    assert check_config(tmp_path, "").returncode == 0
    assert parse("").discovery.enabled is True


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        ("servers:\n  - engine: sglang\n    colour: red\n", 3, "servers[0].colour", "unknown key"),
        ("gpu:\n  enabled: yes please\n", 2, "gpu.enabled", "expected true or false"),
        ("servers:\n  - engine: sglang\n    match: {cmdline: '(unclosed'}\n", 3, "servers[0].match.cmdline",
         "invalid regular expression"),
        ("servers:\n  - engine: sglang\n    probes:\n      - url: http://h/health\n        timeout: soon\n", 5,
         "servers[0].probes[0].timeout", "expected a duration"),
        ("servers:\n  - engine: sglang\n    stall: {gpu_memory_bytes: 70 gigs}\n", 3,
         "servers[0].stall.gpu_memory_bytes", "expected a size"),
        ("servers:\n  - {engine: sglang, name: a}\n  - {engine: vllm, name: a}\n", 3, "servers[1].name",
         "duplicate server name"),
        ("servers:\n  - engine: triton\n", 2, "servers[0].engine", "expected one of sglang, vllm"),
        ("servers:\n  - name: x\n", 2, "servers[0].engine", "missing"),
        ("servers:\n  - engine: generic\n", 2, "servers[0].match.cmdline", "required for engine 'generic'"),
        ("servers:\n  - engine: sglang\n    gpus: [0, -1]\n", 3, "servers[0].gpus[1]", "expected a GPU index"),
        ("servers:\n  - engine: generic\n    match: {cmdline: x}\n    patterns: {booting: [x]}\n", 4,
         "servers[0].patterns.booting", "unknown key"),
        ("servers: {engine: sglang}\n", 1, "servers", "expected a list"),
        ("servers:\n  - engine: sglang\n    engine: vllm\n", 3, "servers[0].engine", "duplicate key"),
        ("servers:\n  - engine: sglang\n    probes: [{url: 'ftp://x'}]\n", 3, "servers[0].probes[0].url",
         "expected an http"),
        ("web:\n  show_evidence: maybe\n", 2, "web.show_evidence", "expected true or false"),
        ("web:\n  history_interval: 0s\n", 2, "web.history_interval", "expected"),
    ],
)
def test_bad_config_names_file_line_key_and_reason(text: str, line: int, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(text, file="c.yml")
    assert str(error.value).startswith(f"c.yml:{line}: {key}: "), error.value
    assert reason in str(error.value)


@pytest.mark.process
def test_check_config_exits_2_with_the_message(tmp_path: Path) -> None:
    result = check_config(tmp_path, "servers:\n  - engine: sglang\n    colour: red\n")
    assert result.returncode == 2
    assert "c.yml:3: servers[0].colour: unknown key" in result.stderr


def test_invalid_yaml_names_its_line() -> None:
    with pytest.raises(ConfigError, match=r"^c\.yml:3: invalid YAML"):
        parse("servers:\n  - engine: sglang\n   bad: [\n", file="c.yml")


@pytest.mark.process
def test_unreadable_file(tmp_path: Path) -> None:
    result = check_config(tmp_path, None, name="missing.yml")
    assert result.returncode == 2
    assert "missing.yml: cannot read config file" in result.stderr


@pytest.mark.process
def test_serve_refuses_bad_config_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("probe: {enabled: 3}\n")
    result = subprocess.run([sys.executable, "-m", "stallwatch", f"--config.file={path}"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "bad.yml:1: probe.enabled: expected true or false" in result.stderr


def test_generic_patterns_become_rules() -> None:
    config = parse("servers:\n  - engine: generic\n    match: {cmdline: 'my-server'}\n"
                   "    patterns:\n      serving: ['ready to serve']\n      events: {fatal: ['PANIC']}\n")
    rules = config.servers[0].rules
    assert [(r.phase, r.event) for r in rules] == [("serving", None), (None, "fatal")]
    with pytest.raises(ConfigError):
        parse("servers:\n  - engine: generic\n    match: {cmdline: x}\n    patterns: {events: {boom: [x]}}\n")


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("10m", 600), ("1h", 3600), ("1h30m", 5400),
                                                ("500ms", 0.5), (15, 15)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "size"), [("70e9", 70e9), ("70GB", 70e9), ("65GiB", 65 * 2**30),
                                            ("512MiB", 512 * 2**20), (1000, 1000), ("1.5 TB", 1.5e12)])
def test_sizes(text: object, size: float) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "1x", "m10", "10m5", "10 s", "-5s", True])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_defaults_apply_where_a_server_is_silent() -> None:
    config = parse("defaults:\n  stall: {log_stale: 3m}\n  probe: {timeout: 2s}\n"
                   "servers:\n  - engine: sglang\n    stall: {gpu_memory_bytes: 70GB}\n"
                   "    probes: [{url: 'http://127.0.0.1:1/health', interval: 1s}]\n")
    server = config.servers[0]
    assert (server.stall.gpu_memory_bytes, server.stall.log_stale) == (70e9, 180)
    assert server.probes is not None
    probe = server.probes[0]
    assert (probe.url, probe.timeout, probe.interval) == ("http://127.0.0.1:1/health", 2, 1)
    assert parse("").defaults.probe.interval == 15


def test_probe_without_url_and_defaults_probe_with_url_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"servers\[0\]\.probes\[0\]\.url: missing"):
        parse("servers:\n  - engine: sglang\n    probes: [{timeout: 1s}]\n")
    with pytest.raises(ConfigError, match=r"defaults\.probe\.url: unknown key"):
        parse("defaults:\n  probe: {url: 'http://x/'}\n")


@pytest.mark.process
def test_every_registered_collector_has_a_section_and_a_flag() -> None:
    from stallwatch.collectors import REGISTRY
    from stallwatch.signals.logs import LogsSettings
    from stallwatch.signals.nvml import GpuSettings

    config = parse("gpu: {sample_interval: 2s}\nlogs: {enabled: false, poll_interval: 0.5s}\nphase: {enabled: false}\n")
    assert config.collector("gpu", GpuSettings).sample_interval == 2
    assert config.collector("logs", LogsSettings) == LogsSettings(enabled=False, poll_interval=0.5)
    with pytest.raises(ConfigError, match=r"c\.yml:1: process\.poll_interval: unknown key; expected one of enabled"):
        parse("process: {poll_interval: 1s}\n", file="c.yml")
    usage = subprocess.run([sys.executable, "-m", "stallwatch", "--help"], capture_output=True, text=True,
                           timeout=30).stdout
    for registration in REGISTRY:
        assert f"--collector.{registration.name}" in usage, registration.name
        assert registration.name in parse("").collectors
