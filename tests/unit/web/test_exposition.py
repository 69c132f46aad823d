"""The exposition: name filtering keeps counters by their sample names."""

from __future__ import annotations

from stallwatch.web.exposition import restrict


def test_restrict_keeps_counter_samples_by_sample_name() -> None:
    from prometheus_client.core import CounterMetricFamily
    counter = CounterMetricFamily("demo_events", "Events.", value=3)
    assert [m.name for m in restrict([counter], ["demo_events_total"])] == ["demo_events"]
    assert restrict([counter], ["demo_events"]) == []
