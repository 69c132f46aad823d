"""What the running exporter keeps: the watcher and each background signal, typed, built once by `app.build` and
handed to the collectors, the status pages and `stallwatch diagnose`, as blackbox_exporter hands its
`ResultHistory` to its handler (`main.go`, `prober/handler.go`). A signal is None where what needs it is off (its
collector disabled): the status pages then say so, and nothing calls it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from stallwatch.config import CollectorSettings, Config
from stallwatch.discovery.watcher import Watcher
from stallwatch.signals.engine_page import EnginePageManager
from stallwatch.signals.history import History
from stallwatch.signals.kmsg import KernelXids
from stallwatch.signals.logs import LogManager
from stallwatch.signals.nvml import Nvml
from stallwatch.signals.probes import ProbeManager
from stallwatch.signals.xid import XidEvents

P = TypeVar("P")


class Background(Protocol):
    """A loop that keeps state (discovery, samplers, log followers)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Runtime:
    config: Config
    watcher: Watcher
    nvml: Nvml | None = None
    xid: XidEvents | None = None  # NVML's events; with nvml
    kernel_xids: KernelXids | None = None  # the kernel log's Xid lines, where readable; with nvml
    probes: ProbeManager | None = None  # its loops follow the watcher (`Watcher.on_change`)
    engine_pages: EnginePageManager | None = None  # likewise
    logs: LogManager | None = None
    history: History | None = None  # the status pages' plots
    collectors: Mapping[str, CollectorSettings] = field(default_factory=dict)  # the settings of those that are on

    def loops(self) -> list[Background]:
        """What is started with the exporter, in order (the watcher first: its first pass finds the servers), and
        stopped at exit."""
        parts: list[Background | None] = [self.watcher, self.nvml, self.xid, self.kernel_xids, self.logs,
                                           self.history]
        return [part for part in parts if part is not None]

    def start(self) -> None:
        for part in self.loops():
            part.start()

    def stop(self) -> None:
        for part in self.loops():
            part.stop()


def required(part: P | None, collector: str) -> P:
    """A collector's signal, which `app.build` makes whenever the collector is on (and `app.oneshot` always)."""
    if part is None:
        raise RuntimeError(f"the {collector} collector's background signal was not built")
    return part
