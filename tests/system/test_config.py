"""The config through the exporter's command line: `--check-config` and `serve` exit 2 with the message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stallwatch.config.reader import ConfigError
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


@pytest.mark.process
def test_check_config_exits_2_with_the_message(tmp_path: Path) -> None:
    result = check_config(tmp_path, "servers:\n  - engine: sglang\n    colour: red\n")
    assert result.returncode == 2
    assert "c.yml:3: servers[0].colour: unknown key" in result.stderr


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


@pytest.mark.process
def test_every_registered_collector_has_a_section_and_a_flag() -> None:
    from stallwatch.collectors import REGISTRY
    from stallwatch.signals.logs import LogsSettings
    from stallwatch.signals.nvml import GpuSettings

    config = parse("gpu: {sample_interval: 2s}\nlogs: {enabled: false, poll_interval: 0.5s}\nphase: {enabled: false}\n")
    assert config.collector("gpu", GpuSettings).sample_interval == 2
    assert config.collector("logs", LogsSettings) == LogsSettings(enabled=False, poll_interval=0.5)
    with pytest.raises(ConfigError,
                       match=r"c\.yml:1: process\.poll_interval: unknown key; expected one of details, enabled"):
        parse("process: {poll_interval: 1s}\n", file="c.yml")
    usage = subprocess.run([sys.executable, "-m", "stallwatch", "--help"], capture_output=True, text=True,
                           timeout=30).stdout
    for registration in REGISTRY:
        assert f"--collector.{registration.name}" in usage, registration.name
        assert f"--no-collector.{registration.name}.details" in usage, registration.name
        assert registration.name in parse("").collectors
        assert not parse("").collector(registration.name, registration.settings).details, registration.name
    assert parse("gpu: {details: true}\n").collector("gpu", GpuSettings).details


@pytest.mark.process
def test_check_config_exits_2_for_refused_values(tmp_path: Path) -> None:
    """`stallwatch check-config` on a file with a lone surrogate in a server name, or on 100,000 `[` that would take
    PyYAML's composer past Python's recursion limit, exits 2 with the key or `nested deeper` on stderr, not a
    traceback."""
    result = check_config(tmp_path, 'servers:\n  - {engine: sglang, name: "x\\ud800"}\n')  # a lone surrogate
    assert result.returncode == 2 and "servers[0].name" in result.stderr, result.stderr
    result = check_config(tmp_path, "[" * 100_000)  # PyYAML's composer would recurse past the limit
    assert result.returncode == 2 and "nested deeper" in result.stderr, result.stderr


@pytest.mark.process
def test_big_and_non_regular_config_files_are_refused_without_reading(tmp_path: Path) -> None:
    """A config path that names a file over 1 MiB, which PyYAML would chew on for minutes, or a FIFO that nobody
    writes, on which a blocking open would hang the exporter at its start, exits 2 with `larger than` or `not a
    regular file`. The reader opens the path non-blocking, checks that it is a regular file and reads at most 1 MiB
    and one byte of it."""
    big = tmp_path / "big.yml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    result = check_config(tmp_path, None, "big.yml")
    assert result.returncode == 2 and "larger than" in result.stderr, result.stderr
    os.mkfifo(tmp_path / "fifo.yml")  # nobody writes it: a blocking open would never return
    result = check_config(tmp_path, None, "fifo.yml")
    assert result.returncode == 2 and "not a regular file" in result.stderr, result.stderr
