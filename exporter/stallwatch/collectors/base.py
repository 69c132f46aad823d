"""What a collector registers: its name, its config section and how to build it, as node_exporter's
`registerCollector` does (`collector/collector.go`). The CLI flags, the config reader and `build()` all
read the one registration."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from prometheus_client.core import Metric

from stallwatch.config import CollectorSettings, Config
from stallwatch.discovery.watcher import Watcher

S = TypeVar("S", bound=CollectorSettings)
B = TypeVar("B", bound="Background")
P = TypeVar("P")


class MetricSource(Protocol):
    """A collector: fresh metric families on every call, read from state that background loops keep."""

    def collect(self) -> Iterable[Metric]: ...


class Background(Protocol):
    """A loop that keeps state for collectors (samplers, probes, log followers)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class Context:
    """What a collector's factory may use: the config, the watched servers, and a place for its loops and for the
    state it keeps that others read too (the status pages read the probe results, log counts, GPU samples)."""

    config: Config
    watcher: Watcher
    background: list[Background] = field(default_factory=list)
    shared: list[object] = field(default_factory=list)

    def run(self, part: B) -> B:
        """Have `part` started with the exporter and stopped at exit."""
        self.background.append(part)
        return self.share(part)

    def share(self, part: P) -> P:
        self.shared.append(part)
        return part

    def find(self, kind: type[P]) -> P | None:
        """The shared part of that kind; None when the collector that keeps it is disabled."""
        return next((part for part in self.shared if isinstance(part, kind)), None)


@dataclass(frozen=True)
class Registration(Generic[S]):
    name: str  # label `collector`, flag `--[no-]collector.<name>`, config section `<name>:`
    settings: type[S]
    build: Callable[[Context, S], MetricSource]
    help: str  # for `--help`
