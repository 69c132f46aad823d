"""Status pages from the running exporter, drawn in Chromium."""

from __future__ import annotations

import base64
import re
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import bcrypt
import psutil
import pytest

from stallwatch.web.routes import status_path
from support import transcripts
from support.harness import Engine, Exporter, gpus, poll, require

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
        enough = found is not None and len([t for t in found.group(1).split(",") if t.strip()]) >= count  # [] is 0
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


def test_the_status_page_says_why_the_engines_page_failed(exporter, engine) -> None:
    """An engine whose `/metrics` never answered made the exporter log a timeout while the status page showed no
    error at all (docs/research/audit-2026-12-01.md #17). The page says `/metrics: timeout` beside `engine figures:
    none`."""
    sim = engine("llamacpp", transcripts.llamacpp_healthy(), final="serve", tp=1, args=("--metrics",),
                 work={"running": 1, "metrics": "hang"})
    e = exporter(config="discovery: {enabled: true, interval: 1s}\nengine_metrics: {interval: 0.3s, timeout: 1s}\n")

    def said() -> str:
        page = e.get(status_path(sim.name))[1]
        return page if "/metrics: timeout" in page else ""

    assert "engine figures: none" in poll(said, timeout=20, what="the page's error on the status page")


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
