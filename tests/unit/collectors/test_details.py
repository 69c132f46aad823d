"""The root collector's details: a collector's detail families (catalog `detail`) and its duration only while its
details are on, from its config section or its `--[no-]collector.<name>.details` flag."""

from __future__ import annotations

from stallwatch.collectors import StallwatchCollector, sections, with_details
from stallwatch.collectors.catalog import family
from stallwatch.config import parse


class _Source:
    def collect(self):
        threads, up = family("process_threads"), family("server_up")
        threads.add_metric(["kimi", "main"], 12.0)
        up.add_metric(["kimi"], 1.0)
        return [threads, up]


def _names(details: frozenset[str]) -> dict[str, set[str]]:
    """Each family the root collector yields, with the collectors its samples name (for the self families)."""
    out: dict[str, set[str]] = {}
    for metric in StallwatchCollector({"process": _Source()}, details).collect():
        out[metric.name] = {s.labels.get("collector", "") for s in metric.samples}
    return out


def test_detail_families_and_the_duration_come_only_with_the_collectors_details() -> None:
    default = _names(frozenset())
    assert "stallwatch_server_up" in default and "stallwatch_process_threads" not in default
    assert "stallwatch_collector_duration_seconds" not in default
    assert default["stallwatch_collector_success"] == {"process"}
    detailed = _names(frozenset({"process"}))
    assert {"stallwatch_server_up", "stallwatch_process_threads"} <= set(detailed)
    assert detailed["stallwatch_collector_duration_seconds"] == {"process"}


def test_a_details_flag_overrides_the_config_and_an_absent_flag_keeps_it() -> None:
    config = parse("gpu: {details: true, sample_interval: 2s}\n", sections())
    assert config.collector("process", sections()["process"]).details is False
    kept = with_details(config, {"gpu": None, "process": True})
    assert kept.collector("gpu", sections()["gpu"]).details is True
    assert kept.collector("gpu", sections()["gpu"]).sample_interval == 2  # the rest of the section stays
    assert kept.collector("process", sections()["process"]).details is True
    assert with_details(config, {"gpu": False}).collector("gpu", sections()["gpu"]).details is False
