"""Status pages `/servers/<name>`: the report, the hour's plots drawn in a real headless Chromium, refresh in
place, evidence (log lines, stacks) only with `web.show_evidence`, names from alert links, and the pieces behind
them (the history ring, the log tail, the plots' series)."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import bcrypt
import psutil
import pytest
from prometheus_client import CollectorRegistry

from stallwatch.config import Config
from stallwatch.config.web import WebConfig
from stallwatch.discovery.processes import ProcessKey
from stallwatch.logs.tail import MAX_LINE_BYTES, LogTail
from stallwatch.report.live import WINDOW_SECONDS, StatusPages, window_start
from stallwatch.runtime import Runtime
from stallwatch.signals.history import History, Point
from stallwatch.web.routes import make_app, status_path
from stallwatch.web.statuspage import series
from support import transcripts
from support.harness import Engine, Exporter, free_port, gpus, poll, require
from support.paths import SIM_BIN
from support.sandbox import DockerContainer, Pod, SystemdUnit

WAIT_FRAME = "wait_for_draft_hidden_states"  # where the simulated engine's processes sleep (tests/sim)
SECRET = "SECRET-PROMPT-7f3a9c"
# SGLang with --log-requests logs each request's input (`Receive: obj=...`, srt/managers/tokenizer_manager.py).
REQUEST_LINE = (f"[{transcripts.SG_DAY} 09:19:52] Receive: obj=GenerateReqInput(text='{SECRET} tell me', "
                "sampling_params={'max_new_tokens': 64}, rid='9f1c')\n")
CONFIG = "defaults:\n  stall:\n    log_stale: 1s\nweb:\n  history_interval: 0.5s\n"


def _stalled(engine: Callable[..., Engine], transcript: str, tp: int = 8) -> tuple[Engine, dict]:
    sim = engine("sglang", transcript, final="stall", tp=tp)
    poll(lambda: sim.log.exists() and "100% Completed" in sim.log.read_text(), what="the last shard line")
    # Its children are titled just before they sleep: from then on every stack shows the wait.
    poll(lambda: sum(p.cmdline()[:1] != [] and p.cmdline()[0].startswith("sglang::")
                     for p in psutil.Process(sim.proc.pid).children()) == tp + 1, what="the titled children")
    held = {"gpus": [dict(g, processes=[{"pid": sim.proc.pid, "used": 76e9}]) for g in gpus(8)]}
    return sim, held


def _stalled_page(e: Exporter, name: str, count: int, headers: dict[str, str] | None = None) -> str:
    """The page once it says the server stalled and its plots have `count` samples."""
    def ready() -> str:
        with urllib.request.urlopen(urllib.request.Request(e.url + status_path(name), headers=headers or {}),
                                    timeout=10) as response:
            status, body = response.status, response.read().decode()
        found = re.search(r'"t": \[([^\]]*)\]', body)
        enough = found is not None and found.group(1).count(",") + 1 >= count
        assert status == 200 and enough and 'class="verdict stalled"' in body, _gist(body)
        return body

    return poll(ready, timeout=15, what=f"a stalled verdict and {count} history samples")


def _gist(body: str) -> str:
    """The verdict, engine and port lines of a page: what a timed-out poll reports."""
    return " | ".join(re.findall(r'<p id="verdict"[^>]*>[^<]*|engine figures[^<\n]*|last probe[^<\n]*|port \d+:[^<\n]*',
                                 body)) or body[:500]


def _chromium(url: str, tmp: Path, budget_ms: int) -> str:
    """The page's DOM after its scripts ran for `budget_ms` of virtual time."""
    out = subprocess.run(
        [require("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'chromium'}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and "</html>" in out.stdout, out.stderr[-2000:]
    return out.stdout


def test_stalled_server_page_renders_plots_and_refreshes_in_chromium(tmp_path: Path, engine, exporter) -> None:
    sim, held = _stalled(engine, transcripts.sglang_until_shards(8, 64))
    e = exporter(config=CONFIG, nvml=held)
    poll(lambda: f'<a href="/servers/{sim.name}">{sim.name}</a>' in e.get("/")[1], what="a link on the landing page")
    _stalled_page(e, sim.name, 3)

    url = f"{e.url}/servers/{sim.name}"
    _check_page(_chromium(url, tmp_path, budget_ms=3_000))  # drawn on load
    dom = _chromium(url, tmp_path, budget_ms=20_000)  # past one 15 s refresh: replaced and drawn again
    assert re.search(r'data-refreshes="[1-9]', dom), "the report was not refreshed in place"
    _check_page(dom)


def _check_page(dom: str) -> None:
    verdict = re.search(r'<p id="verdict" class="verdict (\w+)">([^<]*)</p>', dom)
    assert verdict is not None, dom[:3000]
    assert verdict.group(1) == "stalled"
    assert verdict.group(2).startswith("STALLED: loaded but idle for ") and "in loading_weights" in verdict.group(2)
    assert "port never opened" in verdict.group(2)
    canvases = re.findall(r'<canvas class="plot (\w+)"[^>]*data-points="(\d+)" data-drawn="(-?\d+)"', dom)
    assert {c[0] for c in canvases} == {"memory", "utilization", "log"}, dom[:3000]
    for series_name, points, drawn in canvases:
        assert int(points) >= 2 and int(drawn) > 0, (series_name, points, drawn)
    assert "GPU memory held (GB): now 608 GB" in dom and "weight shards: 64/64" in dom
    assert "server holds 76.0 GB" in dom and "scheduler_TP7" in dom


def test_page_behind_basic_auth_draws_and_refreshes_in_chromium(tmp_path: Path, engine, exporter) -> None:
    sim, held = _stalled(engine, transcripts.sglang_until_shards(8, 64))
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  alice: '{bcrypt.hashpw(b'secret', bcrypt.gensalt(4)).decode()}'\n")
    e = exporter(config=CONFIG, nvml=held, args=(f"--web.config.file={web}",), ready=False)
    assert poll(lambda: e.get(status_path(sim.name))[0], what="an answer") == 401
    _stalled_page(e, sim.name, 3, {"Authorization": "Basic " + base64.b64encode(b"alice:secret").decode()})
    dom = _chromium(f"http://alice:secret@127.0.0.1:{e.port}{status_path(sim.name)}", tmp_path, budget_ms=20_000)
    _check_page(dom)
    assert re.search(r'data-refreshes="[1-9]', dom), "the report was not refreshed behind basic auth"


@pytest.mark.parametrize("shown", [False, True])
def test_evidence_reaches_http_only_when_asked_for(tmp_path: Path, engine, exporter, shown: bool) -> None:
    sim, held = _stalled(engine, REQUEST_LINE + transcripts.sglang_until_shards(8, 64))
    e = exporter(config=CONFIG + f"  show_evidence: {str(shown).lower()}\n", nvml=held)
    page = _stalled_page(e, sim.name, 1)
    assert SECRET in sim.log.read_text()
    for path in ("/", "/metrics", "/static/status.js", "/static/status.css", "/servers/nothing-here"):
        assert SECRET not in e.get(path)[1], path
    assert (SECRET in page) is shown and (SECRET in e.get(status_path(sim.name))[1]) is shown
    stacks = re.search(r"<pre>(Python stacks.*?)</pre>", page, re.DOTALL)
    assert (stacks is not None) is shown and (WAIT_FRAME in page) is shown, stacks and stacks.group(1)
    assert ("web.show_evidence: true" in page) is not shown
    assert "STALLED" in page


def test_a_server_found_after_start_shows_its_log_from_the_first_line(engine, exporter) -> None:
    e = exporter(config="discovery: {enabled: true, interval: 0.5s}\nweb: {show_evidence: true}\n")
    transcript = transcripts.sglang_until_shards(1, 8)
    sim, _ = _stalled(engine, transcript, tp=1)

    def page() -> str:
        status, body = e.get(status_path(sim.name))
        assert status == 200 and "| Loading safetensors checkpoint shards: 100% Completed | 8/8" in body, body[:300]
        return body

    lines = re.findall(r"^  \| (.*)$", poll(page, timeout=15, what="the last shard line"), re.MULTILINE)
    # Every line, the first included; the progress bar's `\r` rewrites collapsed into its last state.
    assert lines[0].startswith("[2026-11-20 09:14:02] server_args=") and len(lines) == transcript.count("\n")


@pytest.mark.parametrize(("work", "verdict"), [
    ({"running": 255, "waiting": 0, "throughput": 0.0, "tokens_start": 1234567, "interval": 0.3},
     "STALLED: serving, holds 255 requests (255 running, 0 waiting) and generated no token"),
    ({"running": 12, "waiting": 3, "throughput": 800.0, "interval": 0.3}, "HEALTHY: serving"),
])
def test_post_ready_hang_from_the_token_history(engine, exporter, work: dict, verdict: str) -> None:
    """Tokens over the page's window come from the history ring's earlier figures, not from a fetch of its own."""
    hang = work["throughput"] == 0
    sim = engine("vllm", transcripts.vllm_post_ready_hang() if hang else transcripts.vllm_healthy(), final="serve",
                 tp=2, work=work)
    held = {"gpus": [dict(g, processes=[{"pid": sim.proc.pid, "used": 76e9}]) for g in gpus(2)]}
    e = exporter(config="defaults:\n  probe: {interval: 0.5s, timeout: 1s}\nengine_metrics: {interval: 0.5s}\n"
                        "web: {history_interval: 0.5s}\n", nvml=held)

    def page() -> str:
        status, body = e.get(status_path(sim.name))
        found = re.search(r"engine figures \(from its metrics\).*tokens \d+ \(in the window: (\d+)\)", body)
        assert status == 200 and found and verdict in body, _gist(body)  # the gist shows if it times out
        return body

    body = poll(page, timeout=30, what=verdict)
    made = int(re.search(r"in the window: (\d+)", body).group(1))  # type: ignore[union-attr]
    assert (made == 0) is hang
    assert "last probe http://" in body


@pytest.mark.root
def test_pod_container_and_unit_pages_show_the_engines_own_lines(tmp_path: Path, exporter) -> None:
    """CRI, json-file and journal framing are gone from the lines shown: the tail sees the decoded text."""
    last = "Loading safetensors checkpoint shards: 100% Completed | 8/8"
    log = transcripts.sglang_until_shards(tp=1, shards=8)
    with contextlib.ExitStack() as stack:
        pod = stack.enter_context(Pod(tmp_path, "sglang", log, namespace="llm", pod="kimi-0", final="stall", tp=1,
                                      port=free_port()))
        docker = stack.enter_context(DockerContainer(tmp_path, "sglang", log, name="kimi-docker", final="stall",
                                                     tp=1, port=free_port()))
        unit = stack.enter_context(SystemdUnit(tmp_path, "sglang", log, unit="kimi.service", final="stall", tp=1,
                                               port=free_port()))
        e = exporter(config="discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n"
                            "web: {show_evidence: true, history_interval: 1s}\n",
                     args=(f"--path.rootfs={tmp_path / 'root'}",),
                     env={**unit.env, "PATH": f"{SIM_BIN}:{os.environ['PATH']}"})  # the stand-in journalctl
        for server, runtime in ((pod.name, "runtime kubernetes (namespace llm, pod kimi-0"),
                                (docker.name, "runtime docker (container kimi-docker)"),
                                (unit.name, "runtime systemd (unit kimi.service)")):
            page = poll(lambda s=server: (lambda r: r[1] if r[0] == 200 and last in r[1] else None)(
                e.get(status_path(s))), timeout=30, what=f"the last shard line on {server}'s page")
            assert runtime in page, page[:1500]
            lines = re.findall(r"^  \| (.*)$", page, re.MULTILINE)
            assert lines[-1].startswith(last) and lines[0].startswith("[2026-11-20 09:14:02] server_args="), lines
            assert not [line for line in lines if " stdout F " in line or '{"log":' in line or "MESSAGE" in line]


def test_names_from_alert_links_404_headers_and_a_disabled_collector(tmp_path: Path, exporter) -> None:
    name = "team a/kimi+0"  # a configured name with a space, a slash and a plus; its process is not running
    e = exporter(config=f"servers:\n  - engine: sglang\n    name: '{name}'\n", args=("--no-collector.gpu",))
    assert status_path(name) == "/servers/team%20a%2Fkimi%2B0"
    for path in (status_path(name), "/servers/team+a%2Fkimi%2B0"):  # ours, and Go's `urlquery` in the rules
        with urllib.request.urlopen(e.url + path, timeout=10) as response:
            body = response.read().decode()
            assert response.status == 200
            assert response.headers["Content-Security-Policy"] == "default-src 'self'"
            assert response.headers["Cache-Control"] == "no-store"
        assert "<h1>team a/kimi+0</h1>" in body
        assert "GPUs: the gpu collector is disabled" in body  # and NVML is left alone
    assert e.get("/servers/")[0] == 404 and e.get("/servers/other")[0] == 404
    with urllib.request.urlopen(e.url + "/static/status.js", timeout=10) as response:
        assert "drawAll" in response.read().decode()
        assert response.headers.get_all("Cache-Control") is None
        assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert e.get("/static/../cli.py")[0] == 404


def test_names_that_are_not_utf8_link_and_resolve() -> None:
    """A pod name with bytes that are not UTF-8 (surrogate-escaped): the landing page links it, the link leads back
    to it, and so does the printable form an alert's label carries."""
    odd = SimpleNamespace(name="llm/pod-\udcff\udcfe", engine=SimpleNamespace(name="sglang"), is_running=lambda: True,
                          launch=SimpleNamespace(probes=[], log_sources=[]))
    watcher = SimpleNamespace(servers=lambda: [odd])
    pages = StatusPages(Runtime(Config(), watcher))  # type: ignore[arg-type]
    assert pages.find(odd.name) is odd and pages.find("llm/pod-\\xff\\xfe") is odd and pages.find("llm/pod-") is None
    asked: list[str] = []
    recording = SimpleNamespace(find=lambda name: asked.append(name))
    app = make_app(CollectorRegistry(), watcher, "/metrics", None, recording)  # type: ignore[arg-type]
    def get(path: str):  # type: ignore[no-untyped-def]
        return app(SimpleNamespace(path=path, method="GET", headers={}, query={}))  # type: ignore[arg-type]

    landing = get("/")
    assert landing.status == 200
    assert '<a href="/servers/llm%2Fpod-%FF%FE">llm/pod-\\xff\\xfe</a>' in landing.body.decode()
    assert get("/servers/llm%2Fpod-%FF%FE").status == 404 and asked[0] == odd.name


def test_status_pages_sit_behind_basic_auth() -> None:
    pages = SimpleNamespace(find=lambda name: pytest.fail("reached the page without credentials"))
    app = make_app(CollectorRegistry(), SimpleNamespace(servers=list), "/metrics",  # type: ignore[arg-type]
                   WebConfig(users={"admin": b"$2b$04$" + b"x" * 53}), pages)  # type: ignore[arg-type]
    for path in ("/servers/x", "/static/status.js"):
        request = SimpleNamespace(path=path, method="GET", headers={}, query={})
        assert app(request).status == 401  # type: ignore[arg-type]


# -- the pieces --------------------------------------------------------------------------------------------------
def test_log_tail_keeps_the_last_lines_and_collapses_rewrites() -> None:
    tail = LogTail()
    tail(b"one\ntwo\n")
    tail(b"\rbar 1/3\rbar 2/3\rbar 3/3\n\x1b[32mthree\x1b[0m\n")
    assert tail.lines() == ["one", "two", "bar 3/3", "three"]
    tail(b"x" * (3 * MAX_LINE_BYTES) + b"\n")
    assert tail.lines()[-1] == "x" * MAX_LINE_BYTES
    assert tail.lines(2)[0] == "three"
    tail(b"four\rfive\r\n")  # a rewrite within one line; `\r\n` ends it
    assert tail.lines(2) == ["x" * MAX_LINE_BYTES, "five"]


def test_log_tail_is_bounded_and_drops_the_cut_line() -> None:
    tail = LogTail()
    for i in range(20_000):
        tail(f"line {i:05d} {'y' * 20}\n".encode())
    assert len(tail._data) <= 2 * LogTail.KEEP_BYTES
    lines = tail.lines(100_000)
    assert lines[-1].startswith("line 19999") and all(re.fullmatch(r"line \d{5} y{20}", x) for x in lines)


def test_log_tail_of_a_100_mb_line_without_newline_stays_small() -> None:
    tail = LogTail()
    chunk = b"z" * (1 << 20)
    for _ in range(100):
        tail(chunk)
    assert len(tail._data) <= 2 * LogTail.KEEP_BYTES
    assert tail.lines() == []  # only a cut piece of one line: nothing whole to show


def _server(name: str, tree: list) -> SimpleNamespace:
    return SimpleNamespace(name=name, spec=SimpleNamespace(gpus=None), tree=lambda: tree,
                           interpreter=SimpleNamespace(figures=lambda: None))


def test_history_ring_is_bounded_and_forgets_gone_servers() -> None:
    now = [1000.0]
    sample = SimpleNamespace(pid=7, create_time=5.0, cpu_user=1.0, cpu_system=0.5)
    servers = [_server("a", [sample]), _server("b", [])]
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
    sample = SimpleNamespace(pid=7, create_time=5.0, cpu_user=1.0, cpu_system=0.5)
    watcher = SimpleNamespace(servers=lambda: [_server("a", [sample])])
    history = History(watcher, interval=10.0, wall=lambda: now[0])  # type: ignore[arg-type]
    for _ in range(100):
        history.sample_once()
        now[0] += 10.0
    points = history.points("a")
    kept = [p.at for p in points if p.cpu]
    assert len(points) == 100 and kept == [p.at for p in points if points[-1].at - p.at <= 180.0]
    assert window_start(points, points[-1].at).cpu  # a minute back still has them


def _point(at: float, lines: int | None, memory: float | None = 2e9, utilization: float | None = 0.5) -> Point:
    return Point(at, memory, utilization, lines, {}, None)


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
