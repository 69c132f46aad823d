"""Process collector: each watched server's main process and its whole tree, by role."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator

from prometheus_client.core import Metric

from stallwatch.collectors.base import Registration
from stallwatch.collectors.catalog import family
from stallwatch.config import CollectorSettings
from stallwatch.discovery.processes import STATES
from stallwatch.discovery.watcher import Watcher


class ProcessCollector:
    def __init__(self, watcher: Watcher) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        up, start = family("server_up"), family("server_start_time_seconds")
        configured, stop_requested = family("server_configured"), family("server_stop_requested")
        states, cpu = family("server_processes"), family("process_cpu_seconds_total")
        rss, threads = family("process_resident_memory_bytes"), family("process_threads")
        for server in self.watcher.servers():
            look = server.look()
            up.add_metric([look.name], 1.0 if look.running else 0.0)
            configured.add_metric([look.name], 1.0 if look.configured else 0.0)
            stop_requested.add_metric([look.name], 1.0 if look.log.stop_requested else 0.0)
            if not look.running:
                continue
            main = next((s for s in look.tree if s.role == "main"), None)
            if main is not None:
                start.add_metric([look.name], main.create_time)
            by_state = Counter(s.state for s in look.tree)
            for state in STATES:
                states.add_metric([look.name, state], float(by_state[state]))
            memory: dict[str, int] = defaultdict(int)
            thread_count: dict[str, int] = defaultdict(int)
            for s in look.tree:
                memory[s.role] += s.rss
                thread_count[s.role] += s.threads
            for role, (user, system) in sorted(look.cpu.items()):
                cpu.add_metric([look.name, role, "user"], user)
                cpu.add_metric([look.name, role, "system"], system)
            for role in sorted(memory):
                rss.add_metric([look.name, role], float(memory[role]))
                threads.add_metric([look.name, role], float(thread_count[role]))
        skipped = family("discovery_skipped_processes")
        skipped.add_metric([], float(self.watcher.skipped))
        yield from (up, configured, stop_requested, start, states, cpu, rss, threads, skipped)


COLLECTOR = Registration("process", CollectorSettings, lambda runtime, _: ProcessCollector(runtime.watcher),
                         "each server's process tree by role: CPU, memory, threads, states")
