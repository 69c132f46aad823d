"""GPU collector: per-device identity, memory, utilization and busy seconds, the cheap health fields (power,
energy, the driver's recovery action, ECC, remapped rows, PCIe replays, the clock event reasons' bitmask), Xid
events, the memory that each watched server's processes hold on each GPU (with that GPU's busy seconds, Xids and
pending recovery action) and the memory nobody watched holds. It reads the
NVML readers' last readings and never calls NVML; a failing device is reported as down, never as stale."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.discovery.watcher import Watcher
from stallwatch.runtime import required
from stallwatch.signals.devices import Device, DeviceFailure, server_memory
from stallwatch.signals.nvml import GpuSettings, Nvml
from stallwatch.signals.xid import XidCount, XidEvents

HEALTH = (  # family -> the `Health` field that feeds it, one sample per GPU
    ("gpu_power_watts", "power_watts"), ("gpu_power_limit_watts", "power_limit_watts"),
    ("gpu_energy_joules_total", "energy_joules"), ("gpu_recovery_action", "recovery_action"),
    ("gpu_ecc_uncorrected_errors_total", "ecc_uncorrected"), ("gpu_pcie_replays_total", "pcie_replays"),
    ("gpu_clock_event_reasons", "clock_event_reasons"),
)
LABELLED_HEALTH = (("gpu_remapped_rows", "remapped_rows"),)


class GpuCollector:
    def __init__(self, nvml: Nvml, watcher: Watcher, xid: XidEvents | None = None) -> None:
        self.nvml, self.watcher, self.xid = nvml, watcher, xid

    def collect(self) -> Iterator[Metric]:
        nvml_up, expected = family("nvml_up"), family("nvml_expected")
        found = self.nvml.read_devices()  # the readers' last readings: no NVML call in a scrape
        if found.broken:
            raise RuntimeError("; ".join(found.broken))
        if found.known:
            nvml_up.add_metric([], 1.0 if found.up else 0.0)
            expected.add_metric([], 1.0 if found.expected else 0.0)
        yield from (nvml_up, expected)
        if not found.up:
            return
        info, up = family("gpu_info"), family("gpu_up")
        used, total = family("gpu_memory_used_bytes"), family("gpu_memory_total_bytes")
        utilization, busy = family("gpu_utilization_ratio"), family("gpu_busy_seconds_total")
        everything: list[Device | DeviceFailure] = [*found.devices, *found.failed]
        for device in sorted(everything, key=lambda d: int(d.index)):
            labels = [device.index, device.uuid]
            if isinstance(device, DeviceFailure):
                up.add_metric(labels, 0.0)
                continue
            up.add_metric(labels, 1.0)
            info.add_metric([*labels, device.name, found.driver], 1.0)
            used.add_metric(labels, device.used)
            total.add_metric(labels, device.total)
            if device.utilization is not None:
                utilization.add_metric(labels, device.utilization)
            seconds = self.nvml.busy_seconds(device.uuid)
            if seconds is not None:
                busy.add_metric(labels, seconds)
        yield from (info, up, used, total, utilization, busy)
        yield from _health(found.devices)
        xids = self.xid.counts() if self.xid is not None else []
        yield from _xid(xids)
        yield from self._memory(found.devices, [f.last for f in found.failed if f.last is not None], xids)

    def _memory(self, devices: list[Device], silent: list[Device], xids: list[XidCount]) -> Iterator[Metric]:
        """What each server holds on each GPU (and that GPU's busy seconds, Xids and pending recovery action, with the
        server), and what no watched server does: processes that are gone (a rank left over from the last run) or
        belong to no watched tree. A GPU a server lists (`gpus:`) is its own. `silent`: the last readings that
        answered of the GPUs that do not answer now, whose memory is withheld but whose Xids still name the servers
        that held memory on them (a GPU that hangs posts its Xid 119 after its last answer)."""
        held, unattributed = family("server_gpu_memory_used_bytes"), family("gpu_unattributed_memory_bytes")
        busy, faults = family("server_gpu_busy_seconds_total"), family("server_gpu_xid_last_timestamp_seconds")
        recovery = family("server_gpu_recovery_action")
        by_gpu: dict[str, list[XidCount]] = {}
        for count in xids:
            by_gpu.setdefault(count.uuid, []).append(count)
        watched: set[int] = set()
        owned: set[str] = set()
        for server in self.watcher.servers():
            look = server.look()
            holdings = server_memory(look, devices)
            for device, memory in holdings:
                labels = [look.name, device.index, device.uuid]
                held.add_metric(labels, memory)
                seconds = self.nvml.busy_seconds(device.uuid)
                if seconds is not None:
                    busy.add_metric(labels, seconds)
                if memory > 0 and device.health.recovery_action:
                    recovery.add_metric(labels, device.health.recovery_action)
            for device, memory in [*holdings, *server_memory(look, silent)] if by_gpu else []:
                if memory > 0:
                    for count in by_gpu.get(device.uuid, []):
                        faults.add_metric([look.name, device.index, device.uuid, count.xid], count.last)
            watched.update(s.pid for s in look.tree)
            owned.update(str(gpu) for gpu in look.spec.gpus or ())
        for device in devices:
            if device.processes is not None and device.index not in owned:
                stray = sum(b for pid, b in device.processes.items() if pid not in watched)
                unattributed.add_metric([device.index, device.uuid], stray)
        yield from (held, busy, faults, recovery, unattributed)


def _xid(xids: list[XidCount]) -> Iterator[Metric]:
    errors, last = family("gpu_xid_errors_total"), family("gpu_xid_last_timestamp_seconds")
    for count in xids:
        errors.add_metric([count.gpu, count.uuid, count.xid], float(count.count))
        last.add_metric([count.gpu, count.uuid, count.xid], count.last)
    yield from (errors, last)


def _health(devices: Iterable[Device]) -> Iterator[Metric]:
    plain = {name: family(name) for name, _ in HEALTH}
    labelled = {name: family(name) for name, _ in LABELLED_HEALTH}
    for device in devices:
        labels = [device.index, device.uuid]
        for name, attribute in HEALTH:
            value = getattr(device.health, attribute)
            if value is not None:
                plain[name].add_metric(labels, value)
        for name, attribute in LABELLED_HEALTH:
            for kind, value in (getattr(device.health, attribute) or {}).items():
                labelled[name].add_metric([*labels, kind], value)
    yield from (*plain.values(), *labelled.values())


COLLECTOR = Registration(
    "gpu", GpuSettings,
    lambda runtime, _: GpuCollector(required(runtime.nvml, "gpu"), runtime.watcher, runtime.xid),
    "GPU memory, utilization, busy seconds, health fields and Xid events through NVML")
