"""`app.build` from the config and the `--[no-]collector.*` flags: the GPU collector turned off by either builds no
NVML at all; asked for by name, NVML is expected even on a node that shows no GPU; NVML reads the node's files under
the configured roots."""

from __future__ import annotations

import pytest

from stallwatch import app
from support.configs import parse


@pytest.mark.parametrize(("text", "flag"), [("", False), ("gpu: {enabled: false}\n", None),
                                            ("gpu: {enabled: true}\n", False)])
def test_the_gpu_collector_turned_off_builds_no_nvml(text: str, flag: bool | None) -> None:
    runtime = app.build(parse(text), {"gpu": flag})
    assert (runtime.nvml, runtime.xid, "gpu" in runtime.collectors) == (None, None, False)


@pytest.mark.parametrize(("text", "flag", "asked"), [
    ("", None, False),  # on by default: a node without GPUs is told apart
    ("gpu: {sample_interval: 2s}\n", None, False),  # a section without `enabled` still leaves it to the default
    ("gpu: {enabled: true}\n", None, True),
    ("", True, True),  # --collector.gpu
    ("gpu: {enabled: false}\n", True, True),  # the flag wins over the file
])
def test_the_gpu_collector_asked_for_by_name_expects_nvml(text: str, flag: bool | None, asked: bool) -> None:
    runtime = app.build(parse(text), {"gpu": flag})
    assert runtime.nvml is not None and runtime.nvml.asked is asked


def test_nvml_reads_the_node_under_the_configured_paths() -> None:
    runtime = app.build(parse("paths: {rootfs: /host, procfs: /host/proc}\n"), {})
    assert runtime.nvml is not None and (runtime.nvml.rootfs, runtime.nvml.procfs) == ("/host", "/host/proc")
