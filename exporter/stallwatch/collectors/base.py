"""What a collector registers: its name, its config section and how to build it from the runtime, as
node_exporter's `registerCollector` does (`collector/collector.go`). The CLI flags, the config reader,
`app.build` and `collectors.build` all read the one registration."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from prometheus_client.core import Metric

from stallwatch.config import CollectorSettings
from stallwatch.runtime import Runtime

S = TypeVar("S", bound=CollectorSettings)


class MetricSource(Protocol):
    """A collector: fresh metric families on every call, read from state that background loops keep."""

    def collect(self) -> Iterable[Metric]: ...


@dataclass(frozen=True)
class Registration(Generic[S]):
    name: str  # label `collector`, flag `--[no-]collector.<name>`, config section `<name>:`
    settings: type[S]  # its section; a collector with a background signal shares the signal's settings
    build: Callable[[Runtime, S], MetricSource]
    help: str  # for `--help`
