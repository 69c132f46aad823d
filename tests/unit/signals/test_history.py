"""The status pages' history ring and the series drawn from it."""

from __future__ import annotations

from types import SimpleNamespace

from stallwatch.discovery.processes import ProcessKey
from stallwatch.report.live import WINDOW_SECONDS, window_start
from stallwatch.signals.history import History, Point
from stallwatch.web.statuspage import series
from support.looks import Looked, look, proc


def _point(at: float, lines: int | None, memory: float | None = 2e9, utilization: float | None = 0.5) -> Point:
    return Point(at, memory, utilization, lines, {}, None)


def test_history_ring_is_bounded_and_forgets_gone_servers() -> None:
    now = [1000.0]
    servers = [Looked(look("a", tree=[proc(7, 5.0, cpu=1.5)])), Looked(look("b"))]
    watcher = SimpleNamespace(servers=lambda: list(servers))
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
    servers.pop()
    history.sample_once()
    assert history.points("b") == [] and len(history.points("a")) == 11


def test_history_keeps_cpu_totals_only_for_recent_points() -> None:
    now = [0.0]
    watcher = SimpleNamespace(servers=lambda: [Looked(look("a", tree=[proc(7, 5.0, cpu=1.5)]))])
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
