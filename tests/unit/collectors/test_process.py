"""The process collector, from looks: a server's tree by role and state, its CPU as the look counted it, and a
server whose process is gone only down."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from prometheus_client.core import Metric

from stallwatch.collectors.process import ProcessCollector
from support.looks import Looked, look, proc


def _families(*servers: Looked) -> dict[str, Metric]:
    watcher = SimpleNamespace(servers=lambda: list(servers), skipped=3)
    return {f.name: f for f in ProcessCollector(watcher).collect()}  # type: ignore[arg-type]


def _value(family: Metric, **labels: str) -> float | None:
    return next((s.value for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())), None)


def test_a_running_server_is_its_tree_by_role_and_its_cpu_as_the_look_counted_it() -> None:
    tree = [proc(10, 1.7e9, "main"), proc(11, 1.7e9, "scheduler_TP0", state="D"), proc(12, 1.7e9, "scheduler_TP0")]
    seen = dataclasses.replace(look("kimi", tree=tree), cpu={"main": (2.0, 1.0), "scheduler_TP0": (8.0, 4.0)})
    families = _families(Looked(seen))
    assert _value(families["stallwatch_server_up"], server="kimi") == 1
    assert _value(families["stallwatch_server_start_time_seconds"], server="kimi") == 1.7e9
    assert _value(families["stallwatch_server_processes"], server="kimi", state="D") == 1
    assert _value(families["stallwatch_server_processes"], server="kimi", state="S") == 2
    # The look's ledger, not the tree's raw counters: what exited stays in it.
    assert _value(families["stallwatch_process_cpu_seconds"], process="scheduler_TP0", mode="user") == 8.0
    assert _value(families["stallwatch_process_threads"], process="scheduler_TP0") == 8
    assert _value(families["stallwatch_discovery_skipped_processes"]) == 3


def test_a_server_whose_process_is_gone_is_only_down() -> None:
    families = _families(Looked(look("gone", running=False)))
    assert _value(families["stallwatch_server_up"], server="gone") == 0
    assert families["stallwatch_process_cpu_seconds"].samples == []
    assert families["stallwatch_server_processes"].samples == []
