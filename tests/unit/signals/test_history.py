"""The status pages' history (`History`): one ring of points per watched server, bounded to its span, oldest first,
dropped with its server, each point reading what the other signals keep (unknown, never zero, when one is off)."""

from __future__ import annotations

import pytest

from stallwatch.config import Config
from stallwatch.discovery.processes import ProcessKey, ProcSample
from stallwatch.engines.base import Figures
from stallwatch.logs.follow import FileStats
from stallwatch.report.live import WINDOW_SECONDS, window_start
from stallwatch.signals.devices import Device, Devices
from stallwatch.signals.engine_page import EnginePageManager, PageState
from stallwatch.signals.history import CPU_KEEP_SECONDS, History, Point
from stallwatch.signals.logs import LogManager
from stallwatch.signals.nvml import Nvml
from stallwatch.web.statuspage import series
from support.clock import Clock
from support.configs import parse
from support.looks import Looked, look, proc

CONFIG = """\
servers:
  - name: a
    engine: vllm
    match: {cmdline: 'no-such-program-a'}
  - name: b
    engine: sglang
    match: {cmdline: 'no-such-program-b'}
    gpus: [1]
"""


class _Watcher:
    """What History reads of the watcher: the servers watched now."""

    def __init__(self, servers: list[Looked]) -> None:
        self.watched = servers

    def servers(self) -> list[Looked]:
        return list(self.watched)


def _servers(trees: dict[str, list[ProcSample]] | None = None) -> list[Looked]:
    """The servers of CONFIG as History sees them: looks whose trees are given (no process of theirs runs here)."""
    config: Config = parse(CONFIG)
    return [Looked(look(spec.name or "", spec.engine, tree=(trees or {}).get(spec.name or "", []), gpus=spec.gpus))
            for spec in config.servers]


def _proc(pid: int, user: float, system: float = 0.0) -> ProcSample:
    return ProcSample(pid, 5.0, "main", "S", user, system, 1 << 20, 4)


def _device(index: int, used: float, utilization: float | None, processes: dict[int, float] | None) -> Device:
    return Device(str(index), f"GPU-{index}", "NVIDIA H100 80GB HBM3", used, 80e9, utilization, processes)


def test_a_ring_keeps_one_span_of_points_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring holds span/interval + 1 points, in the order they were taken, the newest last."""
    clock = Clock(1000.0)
    history = History(_Watcher(_servers()), interval=2.0, span=20.0, wall=clock)  # type: ignore[arg-type]
    for _ in range(25):
        history.sample_once()
        clock.now += 2.0
    assert [p.at for p in history.points("a")] == [1000.0 + 2.0 * i for i in range(14, 25)]


def test_a_ring_holds_at_least_two_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """A span shorter than the interval still keeps two points, so that a rate can be drawn."""
    clock = Clock()
    history = History(_Watcher(_servers()), interval=60.0, span=10.0, wall=clock)  # type: ignore[arg-type]
    for _ in range(5):
        history.sample_once()
        clock.now += 60.0
    assert [p.at for p in history.points("a")] == [clock.now - 120.0, clock.now - 60.0]


def test_a_server_no_longer_watched_loses_its_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring of a server gone from the watcher is dropped; if it comes back it starts anew."""
    clock = Clock()
    a, b = _servers()
    watcher = _Watcher([a, b])
    history = History(watcher, interval=1.0, span=60.0, wall=clock)  # type: ignore[arg-type]
    for _ in range(3):
        history.sample_once()
        clock.now += 1.0
    watcher.watched = [a]
    history.sample_once()
    assert history.points("b") == [] and len(history.points("a")) == 4
    watcher.watched = [a, b]
    history.sample_once()
    assert [p.at for p in history.points("b")] == [clock.now]
    assert history.points("never-watched") == []


def test_points_are_a_copy_of_the_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `points` returns is the reader's own: changing it leaves the ring as it was."""
    history = History(_Watcher(_servers()), interval=1.0, wall=Clock())  # type: ignore[arg-type]
    history.sample_once()
    history.points("a").clear()
    assert len(history.points("a")) == 1


def test_signals_that_are_off_are_unknown_never_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without NVML, log followers or engine figures a point says None for them, and the tree's CPU per process."""
    servers = _servers({"a": [_proc(7, 1.0, 0.5), _proc(8, 2.0)]})
    history = History(_Watcher(servers), interval=1.0, wall=Clock(50.0))  # type: ignore[arg-type]
    history.sample_once()
    (point,) = history.points("a")
    assert (point.at, point.gpu_memory_bytes, point.gpu_utilization, point.log_lines, point.tokens) == (
        50.0, None, None, None, None)
    assert point.cpu == {ProcessKey(7, 5.0): 1.5, ProcessKey(8, 5.0): 2.0}


def test_gpu_memory_and_utilization_come_from_the_nvml_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory is what the server holds on all its GPUs, utilization that of its busiest; NVML down is unknown."""
    a, b = _servers({"a": [_proc(7, 0.0), _proc(8, 0.0)]})
    nvml = Nvml(sample_interval=1.0)
    snapshot = Devices(True, devices=[
        _device(0, 30e9, 0.25, {7: 10e9, 99: 20e9}),  # a's pid 7 holds 10 GB here, someone else's 20
        _device(1, 40e9, 0.75, {8: 5e9}),  # a's pid 8 holds 5 GB; b lists GPU 1 in its config: all 40 GB are b's
        _device(2, 1e9, None, {8: 1e9}),  # a's 1 GB; no utilization known: not the busiest
    ])
    monkeypatch.setattr(nvml, "read_devices", lambda: snapshot)
    history = History(_Watcher([a, b]), interval=1.0, nvml=nvml, wall=Clock())  # type: ignore[arg-type]
    history.sample_once()
    assert (history.points("a")[-1].gpu_memory_bytes, history.points("a")[-1].gpu_utilization) == (16e9, 0.75)
    assert (history.points("b")[-1].gpu_memory_bytes, history.points("b")[-1].gpu_utilization) == (40e9, 0.75)
    monkeypatch.setattr(nvml, "read_devices", lambda: Devices(False, "NVML: Driver Not Loaded"))
    history.sample_once()
    assert (history.points("a")[-1].gpu_memory_bytes, history.points("a")[-1].gpu_utilization) == (None, None)


def test_log_lines_are_summed_over_the_servers_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server's log lines are those of all its files; a server with none followed has read 0."""
    servers = _servers()
    watcher = _Watcher(servers)
    logs = LogManager(watcher, poll_interval=1.0)  # type: ignore[arg-type]
    files = [FileStats("a", "file", "/x/a.log", True, 10, 100, 3, None),
             FileStats("a", "file_2", "/x/b.log", True, 10, 100, 4, None)]
    monkeypatch.setattr(logs, "stats", lambda: files)
    history = History(watcher, interval=1.0, logs=logs, wall=Clock())  # type: ignore[arg-type]
    history.sample_once()
    assert (history.points("a")[-1].log_lines, history.points("b")[-1].log_lines) == (7, 0)


def test_tokens_come_from_the_engine_page_once_it_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens are the page's where it has figures, else unknown (no stats line read either), with their source."""
    servers = _servers()
    pages = EnginePageManager(interval=1.0, timeout=1.0)
    states = [PageState("a", True, figures=Figures(1, 0, 1234.0, 0.0)), PageState("b")]
    monkeypatch.setattr(pages, "states", lambda: states)
    history = History(_Watcher(servers), interval=1.0, pages=pages, wall=Clock())  # type: ignore[arg-type]
    history.sample_once()
    assert (history.points("a")[-1].tokens, history.points("b")[-1].tokens) == (("metrics", 1234.0), None)


def test_cpu_totals_are_dropped_from_points_older_than_they_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-process CPU totals stay only in points at most CPU_KEEP_SECONDS old; the points themselves stay."""
    clock = Clock(0.0)
    servers = _servers({"a": [_proc(7, 1.0)]})
    history = History(_Watcher(servers), interval=10.0, span=600.0, wall=clock)  # type: ignore[arg-type]
    for _ in range(40):
        history.sample_once()
        clock.now += 10.0
    points = history.points("a")
    newest = points[-1].at
    assert len(points) == 40
    assert [p.at for p in points if p.cpu] == [p.at for p in points if newest - p.at <= CPU_KEEP_SECONDS]
    assert all(p.log_lines is None and p.at == 10.0 * i for i, p in enumerate(points))


def test_cpu_totals_are_kept_three_intervals_when_those_are_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an interval of over a minute, the points three intervals back still hold their CPU totals."""
    clock = Clock(0.0)
    servers = _servers({"a": [_proc(7, 1.0)]})
    history = History(_Watcher(servers), interval=100.0, span=3600.0, wall=clock)  # type: ignore[arg-type]
    for _ in range(10):
        history.sample_once()
        clock.now += 100.0
    assert [p.at for p in history.points("a") if p.cpu] == [600.0, 700.0, 800.0, 900.0]


def _point(at: float, lines: int | None, memory: float | None = 2e9, utilization: float | None = 0.5) -> Point:
    return Point(at, memory, utilization, lines, {}, None)


def test_history_ring_is_bounded_and_forgets_gone_servers() -> None:
    now = [1000.0]
    servers = [Looked(look("a", tree=[proc(7, 5.0, cpu=1.5)])), Looked(look("b"))]
    watcher = _Watcher(servers)
    history = History(watcher, interval=1.0, span=10.0, wall=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(30):
        history.sample_once()
        now[0] += 1.0
    points = history.points("a")
    assert len(points) == 11 and points[-1].at == 1029.0 and points[0].at == 1019.0
    assert points[-1].cpu == {ProcessKey(7, 5.0): 1.5}
    assert all(p.cpu for p in points)  # younger than the 3 intervals CPU totals are kept
    # No NVML, no log followers, no engine figures: unknown, never zero.
    assert (points[-1].gpu_memory_bytes, points[-1].log_lines, points[-1].tokens) == (None, None, None)
    watcher.watched.pop()
    history.sample_once()
    assert history.points("b") == [] and len(history.points("a")) == 11


def test_history_keeps_cpu_totals_only_for_recent_points() -> None:
    now = [0.0]
    watcher = _Watcher([Looked(look("a", tree=[proc(7, 5.0, cpu=1.5)]))])
    history = History(watcher, interval=10.0, wall=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(100):
        history.sample_once()
        now[0] += 10.0
    points = history.points("a")
    kept = [p.at for p in points if p.cpu]
    assert len(points) == 100 and kept == [p.at for p in points if points[-1].at - p.at <= 180.0]
    assert window_start(points, points[-1].at).cpu  # a minute back still has them


def test_series_rates_gaps_and_restarts() -> None:
    points = [_point(0, 10), _point(30, 40), _point(60, None, None, None), _point(90, 100), _point(120, 5)]
    data = series(points, now=120.0)
    assert data["t"] == [-120.0, -90.0, -60.0, -30.0, 0.0]
    assert data["log"] == [None, 60.0, None, None, None]  # a gap, then a replaced log's count restarting
    assert data["memory"] == [2.0, 2.0, None, 2.0, 2.0] and data["utilization"] == [50.0, 50.0, None, 50.0, 50.0]


def test_window_start_is_about_a_minute_back() -> None:
    points = [_point(t, 0) for t in (0.0, 30.0, 60.0, 90.0, 100.0)]
    assert window_start(points, 100.0 + 0.0).at == 30.0  # newest at least WINDOW_SECONDS old
    assert window_start(points[3:], 100.0).at == 90.0  # too young: the oldest there is
    assert window_start([], 100.0) is None
    assert WINDOW_SECONDS == 60.0
