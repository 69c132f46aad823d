"""The one composition root: the watcher and every background signal, built once from the config and the
`--[no-]collector.*` flags (`build`), or for one look (`oneshot`); and what serves them over HTTP (`serve`).

Wiring a new background signal: its module under `signals/` (a class with `start`/`stop`, or `reconcile` to follow
the watcher), its field in `runtime.Runtime`, one line here that makes it (from its settings, when its collector is
on), and the collector or report that reads it from the runtime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry

from stallwatch import collectors
from stallwatch.config import CollectorSettings, Config
from stallwatch.config.web import WebConfig
from stallwatch.discovery.watcher import Watcher
from stallwatch.report.live import StatusPages
from stallwatch.runtime import Runtime
from stallwatch.signals.engine_page import EngineMetricsSettings, EnginePageManager
from stallwatch.signals.history import History
from stallwatch.signals.kmsg import KernelXids
from stallwatch.signals.logs import LogManager, LogsSettings
from stallwatch.signals.nvml import GpuSettings, Nvml
from stallwatch.signals.probes import ProbeManager, ProbeSettings
from stallwatch.signals.xid import XidEvents
from stallwatch.web import routes
from stallwatch.web.server import HttpServer, Limits

S = TypeVar("S", bound=CollectorSettings)


def build(config: Config, flags: Mapping[str, bool | None]) -> Runtime:
    """The exporter's runtime: a signal for each collector that is on (`flags`: the `--[no-]collector.<name>`
    values, None where the config decides), the probes and engine pages following the watcher, and the history
    behind the status pages. Nothing is started yet (`Runtime.start`)."""
    on = collectors.enabled(config, flags)
    gpu, probe = _section(on, "gpu", GpuSettings), _section(on, "probe", ProbeSettings)
    pages, logs = _section(on, "engine_metrics", EngineMetricsSettings), _section(on, "logs", LogsSettings)
    nvml = Nvml(gpu.sample_interval, gpu.timeout, rootfs=config.paths.rootfs, procfs=config.paths.procfs,
                asked="gpu" in collectors.asked(config, flags)) if gpu else None
    watcher = Watcher(config, hold_logs=logs is not None, gpu_pids=_gpu_pids(nvml))
    runtime = Runtime(
        config, watcher,
        nvml=nvml,
        probes=ProbeManager(config.paths.procfs, probe.enter_netns) if probe else None,
        engine_pages=EnginePageManager(pages.interval, pages.timeout) if pages else None,
        logs=LogManager(watcher, logs.poll_interval) if logs else None,
        collectors=on)
    if runtime.nvml is not None:
        runtime = dataclasses.replace(runtime, xid=XidEvents(runtime.nvml), kernel_xids=KernelXids(config.paths.kmsg))
    for follower in (runtime.probes, runtime.engine_pages):
        if follower is not None:
            watcher.on_change(follower.reconcile)
    history = History(watcher, config.web.history_interval, nvml=runtime.nvml, logs=runtime.logs,
                      pages=runtime.engine_pages)
    return dataclasses.replace(runtime, history=history)


def oneshot(config: Config) -> Runtime:
    """For `stallwatch diagnose`: every signal of the same config whatever is on, none started or following the
    watcher; the log replay counts the events of the current launch, and the evidence is kept (the reader is the
    node's admin)."""
    config = dataclasses.replace(config, web=dataclasses.replace(config.web, show_evidence=True))
    pages, gpu = config.collector("engine_metrics", EngineMetricsSettings), config.collector("gpu", GpuSettings)
    nvml = Nvml(gpu.sample_interval, gpu.timeout, rootfs=config.paths.rootfs, procfs=config.paths.procfs)
    watcher = Watcher(config, hold_logs=True, gpu_pids=_gpu_pids(nvml))
    # The Xids as the exporter has them (audit 2026-12-02 #12): NVML's events in the window, the kernel log's lines
    # from its start.
    return Runtime(
        config, watcher, nvml=nvml, xid=XidEvents(nvml), kernel_xids=KernelXids(config.paths.kmsg),
        probes=ProbeManager(config.paths.procfs, config.collector("probe", ProbeSettings).enter_netns),
        engine_pages=EnginePageManager(pages.interval, pages.timeout),
        logs=LogManager(watcher, config.collector("logs", LogsSettings).poll_interval, replay_events=True))


def _gpu_pids(nvml: Nvml | None) -> Callable[[], Iterable[int]]:
    """The processes that hold GPU memory in NVML's last readings (no NVML call): whose a configured server is."""
    return (lambda: nvml.read_devices().holders()) if nvml is not None else tuple


def serve(runtime: Runtime, host: str, port: int, telemetry_path: str, web_config: WebConfig | None,
          limits: Limits | None = None) -> HttpServer:
    """Listen (OSError when it cannot), then start the runtime's loops: the root collector over the collectors
    that are on, the status pages, and the routes behind the web config."""
    registry = CollectorRegistry()
    registry.register(collectors.build(runtime))
    app = routes.make_app(registry, runtime.watcher, telemetry_path, web_config, StatusPages(runtime))
    httpd, _ = routes.serve(app, host, port, web_config, limits)
    runtime.start()
    return httpd


def _section(on: Mapping[str, CollectorSettings], name: str, kind: type[S]) -> S | None:
    """The settings of collector `name` when it is on."""
    found = on.get(name)
    return found if isinstance(found, kind) else None
