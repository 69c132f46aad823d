"""The HTML of a server's status page: the diagnose report's verdict and sections, and three plots of the last hour
(GPU memory held, GPU utilization, log lines per minute) that `static/status.js` draws from data in the page and
refreshes in place. Every text in it comes from other processes (names, titles, log lines): escaped here, once.
"""

from __future__ import annotations

import html
import itertools
import json
import time
from dataclasses import dataclass
from pathlib import Path

from stallwatch import __version__
from stallwatch.report.live import StatusView
from stallwatch.report.render import body_sections, describe
from stallwatch.signals.history import SPAN_SECONDS, Point
from stallwatch.text import display

REFRESH_SECONDS = 15
STATIC = Path(__file__).parent / "static"
STATIC_FILES = ("status.js", "status.css")
STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
HIDDEN = ("Log lines and Python stacks are not shown: they can hold prompts and other users' data. "
          "Set <code>web.show_evidence: true</code> in the config to show them here, or run "
          "<code>stallwatch diagnose</code> on the node.")


@dataclass(frozen=True)
class Plot:
    series: str
    title: str
    unit: str
    top: float  # the y axis reaches at least this


PLOTS = (
    Plot("memory", "GPU memory held", "GB", 1.0),
    Plot("utilization", "GPU utilization, busiest GPU", "%", 100.0),
    Plot("log", "Log lines per minute", "/min", 1.0),
)


def static_file(name: str) -> tuple[bytes, str] | None:
    """A file of the page's own (script, style) and its content type; None for any other name."""
    if name not in STATIC_FILES:
        return None
    return (STATIC / name).read_bytes(), STATIC_TYPES[Path(name).suffix]


def series(points: list[Point], now: float) -> dict[str, object]:
    """The plots' data: seconds before `now`, and each series with `None` where unknown."""
    lines: list[float | None] = [None]
    for previous, point in itertools.pairwise(points):
        gap = point.at - previous.at
        known = point.log_lines is not None and previous.log_lines is not None and gap > 0
        rate = (point.log_lines - previous.log_lines) * 60 / gap if known else None  # type: ignore[operator]
        lines.append(rate if rate is None or rate >= 0 else None)  # a replaced log restarts its count
    return {
        "span": SPAN_SECONDS,
        "t": [round(p.at - now, 1) for p in points],
        "memory": [None if p.gpu_memory_bytes is None else p.gpu_memory_bytes / 1e9 for p in points],
        "utilization": [None if p.gpu_utilization is None else p.gpu_utilization * 100 for p in points],
        "log": lines[:len(points)],
    }


def render(view: StatusView, now: float | None = None) -> bytes:
    now = time.time() if now is None else now
    report = view.report
    data = series(view.points, now)
    figures = "".join(_figure(plot, data[plot.series]) for plot in PLOTS)  # type: ignore[arg-type]
    sections = "".join(f"<pre>{_text(text)}</pre>" for text in body_sections(report, view.evidence, "last probe"))
    hidden = "" if view.evidence else f'<p class="hidden-evidence">{HIDDEN}</p>'
    name = _text(report.name)
    # Numbers and nulls only; `<` escaped all the same so the data can never close its element.
    history = json.dumps(data).replace("<", "\\u003c")
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{name}: stallwatch</title>"
        '<link rel="stylesheet" href="/static/status.css"><script src="/static/status.js" defer></script></head>'
        f'<body data-refresh="{REFRESH_SECONDS}"><nav><a href="/">stallwatch</a> / {name}</nav>'
        f'<main id="report"><h1>{name}</h1>'
        f'<p id="verdict" class="verdict {html.escape(report.verdict.status)}">'
        f"{_text(report.verdict.status.upper())}: {_text(report.verdict.text)}</p>"
        f"<pre>{_text(chr(10).join(describe(report)))}</pre>"
        f'<section class="plots">{figures}</section>'
        f'<script type="application/json" id="history">{history}</script>'
        f"{sections}{hidden}"
        f'<p class="made">Made {made} by stallwatch {html.escape(__version__)}; refreshed every '
        f"{REFRESH_SECONDS} s. Plots: the last hour, one sample every {_interval(view.points)}.</p>"
        "</main></body></html>"
    )
    return page.encode("utf-8", "backslashreplace")


def _figure(plot: Plot, values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    latest = f"now {known[-1]:.3g} {plot.unit}" if known else "no data yet"
    return (f'<figure><figcaption>{plot.title} ({plot.unit}): {latest}</figcaption>'
            f'<canvas class="plot {plot.series}" data-series="{plot.series}" data-top="{plot.top:g}" width="460" '
            'height="120"></canvas></figure>')


def _interval(points: list[Point]) -> str:
    if len(points) < 2:
        return "few seconds (just started)"
    return f"{(points[-1].at - points[0].at) / (len(points) - 1):.0f} s"


def _text(text: str) -> str:
    return html.escape(display(text))
