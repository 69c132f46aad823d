"""The exporter as a process: its flags, pages, GPU collectors on the fake NVML, probes and discovery."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pynvml
import pytest

from stallwatch.collectors import REGISTRY
from support import transcripts as t
from support.docs import documented
from support.harness import GIB, Scrape, free_port, gpus, poll, require


class _Target(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/hang":
            time.sleep(3)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/ok")
            self.end_headers()
            return
        body = b"x" * (10 * 2**20) if self.path == "/big" else b"ok"
        self.send_response(503 if self.path == "/503" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the prober reads 64 KiB and hangs up
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_landing_page_health_and_404(exporter) -> None:
    e = exporter()
    status, body = e.get("/")
    assert status == 200 and "stallwatch" in body and 'href="/metrics"' in body
    assert e.get("/-/healthy")[0] == 200
    assert e.get("/nope")[0] == 404
    assert e.scrape().value("stallwatch_build_info") == 1


def test_flags_telemetry_path_and_disabled_collector(exporter) -> None:
    e = exporter(args=("--web.telemetry-path=/m", "--no-collector.gpu"))
    status, body = e.get("/m")
    assert status == 200
    scrape = Scrape(body)
    collectors = {s.labels["collector"] for s in scrape.samples("stallwatch_collector_success")}
    assert collectors == {r.name for r in REGISTRY} - {"gpu"}
    assert e.get("/metrics")[0] == 404


@pytest.mark.process
def test_version_flag() -> None:
    out = subprocess.run([sys.executable, "-m", "stallwatch", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and re.match(r"stallwatch \d+\.\d+\.\d+", out.stdout)


@pytest.mark.process
def test_bad_listen_address_exits_2() -> None:
    out = subprocess.run([sys.executable, "-m", "stallwatch", "--web.listen-address=nope"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--web.listen-address" in out.stderr


def test_no_nvml_reports_down_and_logs_once(exporter) -> None:
    e = exporter(nvml={"missing": True})
    # Absent until NVML's first survey ended (in the background, just after the exporter listens), then 0.
    scrape = e.wait_for(lambda s: s.value("stallwatch_nvml_up") is not None and s, what="the first NVML survey")
    assert scrape.value("stallwatch_nvml_up") == 0
    assert scrape.value("stallwatch_collector_success", collector="gpu") == 1
    assert scrape.samples("stallwatch_gpu_up") == []
    time.sleep(3.5)  # the sampler's backoff retries at 1 s, 2 s: those retries must not log again
    assert e.scrape().value("stallwatch_nvml_up") == 0
    assert e.log.read_text().count("NVML unavailable") == 1


@pytest.mark.parametrize("devices", [(), ("nvidiactl", "nvidia0")])
def test_a_node_without_an_nvidia_gpu_is_told_from_a_broken_gpu_node(exporter, tmp_path: Path,
                                                                     devices: tuple[str, ...]) -> None:
    """NVML's library missing under a `--path.rootfs` whose /dev shows no NVIDIA device: nvml_expected 0 and one info
    line saying how to turn the collector off, nothing more on the retries; with NVIDIA device nodes there, a GPU node
    whose driver is broken: nvml_expected 1 and one warning."""
    if not devices and Path("/proc/driver/nvidia").is_dir():
        pytest.skip("this host's procfs shows the NVIDIA driver: every node it runs is a GPU node")
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    for name in ("null", "zero", *devices):
        (root / "dev" / name).touch()
    e = exporter(nvml={"missing": True}, args=(f"--path.rootfs={root}",))
    scrape = e.wait_for(lambda s: s.value("stallwatch_nvml_up") is not None and s, what="the first NVML survey")
    assert (scrape.value("stallwatch_nvml_up"), scrape.value("stallwatch_nvml_expected")) == (0, 1 if devices else 0)
    time.sleep(3.5)  # the backoff's retries at 1 s and 2 s log nothing above debug
    said = [line for line in e.log.read_text().splitlines() if " stallwatch.signals.nvml: " in line]
    assert len(said) == 1, said
    if devices:
        assert " WARNING " in said[0]
    else:
        assert " INFO " in said[0] and "no NVIDIA GPU" in said[0] and "--no-collector.gpu" in said[0]


def test_eight_idle_gpus(exporter) -> None:
    e = exporter(nvml={"driver": "550.54.15", "gpus": gpus(8, used=76e9, util=0)})
    scrape = e.wait_for(lambda s: len(s.samples("stallwatch_gpu_busy_seconds_total")) == 8 and s)
    assert scrape.value("stallwatch_nvml_up") == 1
    for i in range(8):
        labels = {"gpu": str(i), "uuid": f"GPU-5f1c2d3e-0000-4000-8000-{i:012d}"}
        assert scrape.value("stallwatch_gpu_up", **labels) == 1
        assert scrape.value("stallwatch_gpu_memory_used_bytes", **labels) == 76e9
        assert scrape.value("stallwatch_gpu_memory_total_bytes", **labels) == 80 * GIB
        assert scrape.value("stallwatch_gpu_utilization_ratio", **labels) == 0
        assert scrape.value("stallwatch_gpu_busy_seconds_total", **labels) == 0
        assert scrape.value("stallwatch_gpu_info", **labels, name="NVIDIA H100 80GB HBM3",
                            driver_version="550.54.15") == 1


def test_busy_gpu_integrates_busy_seconds(exporter) -> None:
    e = exporter(nvml={"gpus": gpus(2, util=0)})
    e.nvml.update(gpus=[gpus(1, util=0)[0], {**gpus(2)[1], "util": 100}])
    first = e.wait_for(lambda s: s.value("stallwatch_gpu_busy_seconds_total", gpu="1"))
    start = time.monotonic()
    later = e.wait_for(lambda s: (v := s.value("stallwatch_gpu_busy_seconds_total", gpu="1")) >= first + 2 and v)
    elapsed = time.monotonic() - start
    assert later - first <= elapsed + 1.5  # never more busy time than wall time
    scrape = e.scrape()
    assert scrape.value("stallwatch_gpu_utilization_ratio", gpu="1") == 1.0
    assert scrape.value("stallwatch_gpu_busy_seconds_total", gpu="0") == 0


def test_gpu_lost_mid_run_is_down_and_not_stale(exporter) -> None:
    e = exporter(nvml={"gpus": gpus(4)})
    e.wait_for(lambda s: len(s.samples("stallwatch_gpu_up")) == 4)
    lost = gpus(4)
    lost[2]["lost"] = True
    e.nvml.update(gpus=lost)
    scrape = e.wait_for(lambda s: s.value("stallwatch_gpu_up", gpu="2") == 0 and s)
    assert scrape.value("stallwatch_nvml_up") == 1
    assert scrape.value("stallwatch_collector_success", collector="gpu") == 1
    assert scrape.value("stallwatch_gpu_memory_used_bytes", gpu="2") is None
    assert scrape.value("stallwatch_gpu_busy_seconds_total", gpu="2") is None
    assert [scrape.value("stallwatch_gpu_up", gpu=str(i)) for i in (0, 1, 3)] == [1, 1, 1]
    assert "NVMLError_GpuIsLost" in e.log.read_text()


def test_not_supported_fields_are_omitted(exporter) -> None:
    nvml = gpus(2, util=100)
    nvml[0]["unsupported"] = ["utilization", "memory_v2", "processes"]
    nvml[1]["unsupported"] = ["samples"]  # busy seconds from the utilization rate instead
    e = exporter(nvml={"gpus": nvml})
    scrape = e.wait_for(lambda s: (s.value("stallwatch_gpu_busy_seconds_total", gpu="1") or 0) > 1 and s)
    assert scrape.value("stallwatch_gpu_utilization_ratio", gpu="0") is None
    assert scrape.value("stallwatch_gpu_memory_used_bytes", gpu="0") == 76e9  # v1 memory info
    assert scrape.value("stallwatch_gpu_utilization_ratio", gpu="1") == 1.0


def test_a_gpu_whose_calls_block_is_down_and_the_scrape_stays_fast(exporter) -> None:
    """Xid 119 (a GSP RPC timeout): every NVML call on one GPU blocks for 45 s (open-gpu-kernel-modules#446). The
    scrape answers at once: that GPU reads down under its own uuid with its values withheld, the other GPUs and
    collectors as before. The 119 it posts is counted at once under its gpu and uuid, and another GPU's Xid right
    after it does not wait behind it (audit 2026-12-02 #3)."""
    nvml = gpus(4)
    e = exporter(nvml={"gpus": nvml}, config="gpu: {sample_interval: 0.2s, timeout: 3s}\n")
    e.wait_for(lambda s: len(s.samples("stallwatch_gpu_memory_used_bytes")) == 4, what="4 GPUs read")
    cleanup = [{"id": f"45-{index}", "gpu": index, "data": 45} for index in (1, 2)]  # each GPU's events registered
    e.nvml.update(events=cleanup)
    e.wait_for(lambda s: len(s.samples("stallwatch_gpu_xid_errors_total")) == 2, what="Xid 45 on GPUs 1 and 2")
    nvml[2]["block"] = 45
    e.nvml.update(gpus=nvml)
    scrape = e.wait_for(lambda s: s.value("stallwatch_gpu_up", gpu="2") == 0 and s, what="GPU 2 down")
    assert scrape.labelsets("stallwatch_gpu_up")[2] == {"gpu": "2", "uuid": nvml[2]["uuid"]}
    e.nvml.update(events=[*cleanup, {"id": 1, "gpu": 2, "data": 119}, {"id": 2, "gpu": 1, "data": 79}])
    posted = time.monotonic()
    scrape = e.wait_for(lambda s: len(s.samples("stallwatch_gpu_xid_errors_total")) == 4 and s, what="Xids 119, 79")
    assert time.monotonic() - posted < 20  # not after the hung GPU's 45 s call
    assert scrape.value("stallwatch_gpu_xid_errors_total", gpu="2", uuid=nvml[2]["uuid"], xid="119") == 1
    assert scrape.value("stallwatch_gpu_xid_errors_total", gpu="1", uuid=nvml[1]["uuid"], xid="79") == 1
    assert f"Xid 119 on GPU 2 {nvml[2]['uuid']}" in e.log.read_text()
    assert [ls["gpu"] for ls in scrape.labelsets("stallwatch_gpu_memory_used_bytes")] == ["0", "1", "3"]
    assert [ls["gpu"] for ls in scrape.labelsets("stallwatch_gpu_info")] == ["0", "1", "3"]
    assert scrape.value("stallwatch_gpu_up", gpu="3") == 1 and scrape.value("stallwatch_nvml_up") == 1
    assert scrape.value("stallwatch_collector_success", collector="gpu") == 1
    durations = []
    for _ in range(10):  # the GPU 2 reader sits in its call all along
        start = time.monotonic()
        assert e.get("/metrics")[0] == 200
        durations.append(time.monotonic() - start)
    # None waited for the blocked call, nor for the 3 s timeout that marks it overdue (on a loaded machine too).
    assert max(durations) < 3.0, durations
    assert e.scrape().value("stallwatch_gpu_up", gpu="2") == 0


def test_an_exporter_started_while_one_gpu_hangs_counts_the_other_gpus_xids(exporter) -> None:
    """Restarted while GPU 0's calls block (audit 2026-12-02 #4): the other GPUs register their events at once, each
    on its own, and an Xid on GPU 2 is counted; GPU 0 is said not registered, and counts once it answers."""
    nvml = gpus(3)
    nvml[0]["block"] = 45
    e = exporter(nvml={"gpus": nvml}, config="gpu: {sample_interval: 0.2s, timeout: 2s}\n")
    e.wait_for(lambda s: s.value("stallwatch_gpu_up", gpu="2") == 1, what="GPU 2 read")
    e.nvml.update(events=[{"id": 1, "gpu": 2, "data": 48}])
    e.wait_for(lambda s: s.value("stallwatch_gpu_xid_errors_total", gpu="2", uuid=nvml[2]["uuid"], xid="48") == 1,
               what="GPU 2's Xid 48")
    poll(lambda: "GPU 0: NVML events not registered: it has not answered NVML for 2s" in e.log.read_text(),
         what="GPU 0 said not registered")
    nvml[0]["block"] = 0
    e.nvml.update(gpus=nvml)
    poll(lambda: "NVML events registered on GPU 0" in e.log.read_text(), what="GPU 0 registered once it answers")
    e.nvml.update(events=[{"id": 1, "gpu": 2, "data": 48}, {"id": 2, "gpu": 0, "data": 119}])
    e.wait_for(lambda s: s.value("stallwatch_gpu_xid_errors_total", gpu="0", uuid=nvml[0]["uuid"], xid="119") == 1,
               what="GPU 0's Xid 119")


def test_gpu_health_fields_xid_events_and_memory_nobody_watched(exporter, engine) -> None:
    """Power, energy, the driver's recovery action, ECC, remapped rows, PCIe replays and clock event reasons where
    the GPU has them (absent where not); Xid 79 then 119 from NVML's event API, each counted once with its time;
    memory held by a process in no watched tree (a rank left over from the last run)."""
    sim = engine("sglang", t.sglang_until_shards(tp=1, shards=4), final="stall", tp=1)
    nvml = gpus(2)
    nvml[0].update(power=69.5, power_limit=700, energy=1000, recovery_action=1, ecc_uncorrected=2,
                   remapped_rows=[3, 1, 1, 0], pcie_replays=7, clock_reasons=0x1 | 0x80,
                   processes=[{"pid": sim.proc.pid, "used": 60e9}, {"pid": 999_999_999, "used": 16e9}])
    e = exporter(nvml={"gpus": nvml})
    scrape = e.wait_for(lambda s: s.value("stallwatch_gpu_power_watts", gpu="0") and s, what="GPU 0's health")
    assert scrape.value("stallwatch_gpu_power_watts", gpu="0") == 69.5
    assert scrape.value("stallwatch_gpu_power_limit_watts", gpu="0") == 700
    assert scrape.value("stallwatch_gpu_energy_joules_total", gpu="0") >= 1000
    assert scrape.value("stallwatch_gpu_recovery_action", gpu="0") == 1
    assert scrape.value("stallwatch_gpu_ecc_uncorrected_errors_total", gpu="0") == 2
    assert {ls["kind"]: scrape.value("stallwatch_gpu_remapped_rows", **ls)
            for ls in scrape.labelsets("stallwatch_gpu_remapped_rows")} == {
        "correctable": 3, "uncorrectable": 1, "pending": 1, "failure": 0}
    assert scrape.value("stallwatch_gpu_pcie_replays_total", gpu="0") == 7
    # One bitmask series per GPU, NVML's own bits (nvidia-ml-py's constants), as dcgm-exporter exports it.
    assert scrape.value("stallwatch_gpu_clock_event_reasons", gpu="0") == (
        pynvml.nvmlClocksEventReasonGpuIdle | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)
    for name in ("power_watts", "energy_joules_total", "recovery_action", "remapped_rows", "clock_event_reasons"):
        assert not [ls for ls in scrape.labelsets(f"stallwatch_gpu_{name}") if ls["gpu"] == "1"], name
    scrape = e.wait_for(lambda s: s.value("stallwatch_gpu_unattributed_memory_bytes", gpu="0") == 16e9 and s,
                        what="the stray process's memory")
    assert scrape.value("stallwatch_server_gpu_memory_used_bytes", server=sim.name, gpu="0") == 60e9

    e.nvml.update(events=[{"id": 1, "gpu": 1, "type": "xid", "data": 79}])
    scrape = e.wait_for(lambda s: s.value("stallwatch_gpu_xid_errors_total", gpu="1", xid="79") == 1 and s,
                        what="Xid 79")
    first = scrape.value("stallwatch_gpu_xid_last_timestamp_seconds", gpu="1", xid="79")
    assert abs(first - time.time()) < 30
    e.nvml.update(events=[{"id": 1, "gpu": 1, "type": "xid", "data": 79}, {"id": 2, "gpu": 1, "data": 119}])
    scrape = e.wait_for(lambda s: s.value("stallwatch_gpu_xid_errors_total", gpu="1", xid="119") == 1 and s,
                        what="Xid 119")
    assert scrape.value("stallwatch_gpu_xid_errors_total", gpu="1", xid="79") == 1  # delivered once
    assert scrape.value("stallwatch_gpu_xid_last_timestamp_seconds", gpu="1", xid="79") == first

    # The server's status page shows its GPU's power, recovery action and Xids, and its verdict is the fault's.
    e.nvml.update(events=[{"id": 3, "gpu": 0, "type": "xid", "data": 13}])

    def status_page_with_the_xid() -> str | None:
        body = e.get(f"/servers/{sim.name}")[1]
        return body if "Xid 13 x1" in body else None

    page = poll(status_page_with_the_xid, what="the Xid on the status page")
    assert "70 W of 700 W, recovery action GPU reset; Xid 13 x1 " in page
    assert "(a graphics engine exception)" in page
    assert "FAILED: GPU 0 (GPU-" in page and "the driver asks for: GPU reset" in page
    # The fault page's series: GPU 0's Xid and recovery action with the server that holds memory on it; GPU 1's Xid
    # 79 with nobody (no server holds memory on GPU 1).
    scrape = e.wait_for(lambda s: s.labelsets("stallwatch_server_gpu_xid_last_timestamp_seconds") and s,
                        what="the Xid with its server")
    assert scrape.labelsets("stallwatch_server_gpu_xid_last_timestamp_seconds") == [
        {"server": sim.name, "gpu": "0", "uuid": nvml[0]["uuid"], "xid": "13"}]
    assert scrape.value("stallwatch_server_gpu_xid_last_timestamp_seconds", server=sim.name, xid="13") == \
        scrape.value("stallwatch_gpu_xid_last_timestamp_seconds", gpu="0", xid="13")
    assert scrape.labelsets("stallwatch_server_gpu_recovery_action") == [
        {"server": sim.name, "gpu": "0", "uuid": nvml[0]["uuid"]}]
    assert scrape.value("stallwatch_server_gpu_recovery_action", server=sim.name, gpu="0") == 1


def test_event_set_rebuilt_after_an_error(exporter) -> None:
    """A wait that fails with an error other than its timeout: the event set is freed and built again (after a
    second's backoff), and the Xid that comes next is counted."""
    e = exporter(nvml={"gpus": gpus(2), "wait_errors": 1, "events": [{"id": 1, "gpu": 1, "type": "xid", "data": 48}]})
    e.wait_for(lambda s: s.value("stallwatch_gpu_xid_errors_total", gpu="1", xid="48") == 1, what="the Xid after it")
    assert "NVML events stopped (NVMLError_Unknown" in e.log.read_text()


def test_kernel_log_xid_lines_name_the_process(exporter, engine, tmp_path: Path) -> None:
    """Where the kernel log is readable, its Xid lines (from before the exporter started too) add the process and
    the driver's words to the status page: the server's own rank, and a process that is not the server's."""
    sim = engine("sglang", t.sglang_until_shards(tp=1, shards=4), final="stall", tp=1)
    nvml = gpus(2)
    nvml[0]["processes"] = [{"pid": sim.proc.pid, "used": 60e9}]
    at = int((time.monotonic() - 300) * 1e6)  # /dev/kmsg's clock: microseconds since boot, 5 minutes ago
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(
        f"4,101,{at},-;NVRM: Xid (PCI:0000:18:00): 13, pid={sim.proc.pid}, name=python3, Graphics Exception: "
        "ESR 0x404490=0x80000002\n".encode()
        + f"4,102,{at},-;NVRM: Xid (PCI:0000:18:00): 31, pid=999999999, name=stray, MMU Fault\n".encode())
    e = exporter(nvml={"gpus": nvml}, config=f"paths: {{kmsg: {kmsg}}}\n")

    def status_page_with_the_lines() -> str | None:
        body = e.get(f"/servers/{sim.name}")[1]
        return body if "Xid 31" in body else None

    page = poll(status_page_with_the_lines, what="the kernel log's Xids on the status page")
    assert (f"Xid 13 in the kernel log 5 min ago (a graphics engine exception); pid {sim.proc.pid} &quot;python3&quot; "
            "(main): Graphics Exception: ESR 0x404490=0x80000002") in page
    assert ("Xid 31 in the kernel log 5 min ago (a memory page fault); pid 999999999 &quot;stray&quot; "
            "(not this server&#x27;s)") in page


def test_failing_collector_is_isolated(exporter) -> None:
    e = exporter(nvml={"gpus": [{"total": "not a number"}]})
    scrape = e.wait_for(lambda s: s.value("stallwatch_collector_success", collector="gpu") == 0 and s,
                        what="the GPU reader's failure")
    assert scrape.value("stallwatch_collector_success", collector="process") == 1
    assert scrape.value("stallwatch_build_info") == 1


def test_sglang_tree_discovered_with_roles_states_and_gpu_memory(exporter, engine) -> None:
    from support.transcripts import sglang_until_shards

    sim = engine("sglang", sglang_until_shards(), final="stall", tp=8)
    e = exporter(nvml={"gpus": gpus(8)})
    roles = {"main", "detokenizer", *(f"scheduler_TP{i}" for i in range(8))}
    scrape = e.wait_for(lambda s: roles <= {ls["process"] for ls in s.labelsets(
        "stallwatch_process_resident_memory_bytes") if ls["server"] == sim.name} and s, what="scheduler titles")
    assert scrape.value("stallwatch_server_up", server=sim.name) == 1
    assert scrape.value("stallwatch_server_start_time_seconds", server=sim.name) > 1e9
    assert scrape.value("stallwatch_server_processes", server=sim.name, state="S") >= 10
    assert scrape.value("stallwatch_process_threads", server=sim.name, process="scheduler_TP3") >= 1
    assert scrape.value("stallwatch_process_cpu_seconds_total", server=sim.name, process="main", mode="user") > 0
    assert all("pid" not in ls and not re.search(r"\d{3,}", ls["process"])
               for ls in scrape.labelsets("stallwatch_process_threads") if ls["server"] == sim.name)
    # The health URL derived from --port: refused while "loading".
    url = f"http://127.0.0.1:{sim.port}/health"
    scrape = e.wait_for(lambda s: (s.probe("stallwatch_probe_failures_total", server=sim.name, url=url,
                                           reason="refused") or 0) >= 1 and s)
    assert scrape.probe("stallwatch_probe_success", server=sim.name, url=url) == 0
    assert scrape.probe("stallwatch_probe_http_status_code", server=sim.name, url=url) == 0
    # The log file comes from the main process's stdout.
    assert str(sim.log) in e.get("/")[1]
    # NVML's process list, matched against the tree: each scheduler holds 76 GB on its GPU.
    import psutil

    children = {p.cmdline()[0]: p.pid for p in psutil.Process(sim.proc.pid).children(recursive=True)
                if p.cmdline() and p.cmdline()[0].startswith("sglang::scheduler")}
    held = gpus(8)
    for i in range(8):
        held[i]["processes"] = [{"pid": children[f"sglang::scheduler_TP{i}"], "used": 75e9},
                                {"pid": 1, "used": 1e9}]  # someone else's process does not count
    e.nvml.update(gpus=held)
    scrape = e.wait_for(lambda s: len([ls for ls in s.labelsets("stallwatch_server_gpu_memory_used_bytes")
                                       if ls["server"] == sim.name]) == 8 and s)
    assert scrape.value("stallwatch_server_gpu_memory_used_bytes", server=sim.name, gpu="5") == 75e9
    assert scrape.value("stallwatch_stall_gpu_memory_threshold_bytes", server=sim.name) == 1e9
    assert scrape.value("stallwatch_stall_log_stale_threshold_seconds", server=sim.name) == 600

    sim.stop()
    e.wait_for(lambda s: s.value("stallwatch_server_up", server=sim.name) == 0)


def test_exited_child_keeps_its_cpu(exporter, engine) -> None:
    from support.transcripts import sglang_until_shards

    sim = engine("sglang", sglang_until_shards(tp=1), tp=1, burn_child_seconds=3.0)
    e = exporter()

    def cpu(s: Scrape) -> float:
        return sum(s.value("stallwatch_process_cpu_seconds_total", server=sim.name, process="short_lived",
                           mode=m) or 0 for m in ("user", "system"))

    seen = e.wait_for(lambda s: cpu(s) >= 1.0 and cpu(s), what="CPU of the short-lived child")
    e.wait_for(lambda s: s.value("stallwatch_process_threads", server=sim.name, process="short_lived") is None,
               what="the child to exit")
    assert cpu(e.scrape()) >= seen


def test_vllm_serving_probe_succeeds(exporter, engine) -> None:
    from support.transcripts import vllm_healthy

    sim = engine("vllm", vllm_healthy(), final="serve", tp=2)
    e = exporter()
    url = f"http://127.0.0.1:{sim.port}/health"
    scrape = e.wait_for(lambda s: s.probe("stallwatch_probe_success", server=sim.name, url=url) == 1 and s,
                        timeout=20)
    assert scrape.probe("stallwatch_probe_http_status_code", server=sim.name, url=url) == 200
    assert abs(scrape.probe("stallwatch_probe_last_success_timestamp_seconds", server=sim.name, url=url)
               - time.time()) < 60
    e.wait_for(lambda s: {"main", "EngineCore", "Worker_TP0", "Worker_TP1"} <= {
        ls["process"] for ls in s.labelsets("stallwatch_process_threads") if ls["server"] == sim.name})


def test_probe_outcomes(exporter, target: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}/health"
    urls = {"ok": f"{target}/ok", "503": f"{target}/503", "redirect": f"{target}/redirect",
            "hang": f"{target}/hang", "big": f"{target}/big", "refused": closed}
    probes = "".join(f"      - {{url: '{u}', timeout: 1s, interval: 1s}}\n" for u in urls.values())
    # A matcher no process has: another SGLang on this machine must not change the result.
    e = exporter(config=f"servers:\n  - name: probed\n    engine: sglang\n"
                 f"    match: {{cmdline: 'no-such-process-{free_port()}'}}\n    probes:\n{probes}")

    def value(s: Scrape, metric: str, key: str, **labels: str) -> float | None:
        return s.probe(metric, server="probed", url=urls[key], **labels)

    scrape = e.wait_for(lambda s: all(value(s, "stallwatch_probe_success", k) is not None for k in urls) and s,
                        what="every probe to finish once")
    assert value(scrape, "stallwatch_probe_success", "ok") == 1
    assert value(scrape, "stallwatch_probe_success", "big") == 1
    assert value(scrape, "stallwatch_probe_duration_seconds", "big") < 1
    expected = {"503": ("http_status", 503), "redirect": ("http_status", 302), "hang": ("timeout", 0),
                "refused": ("refused", 0)}
    for key, (reason, code) in expected.items():
        assert value(scrape, "stallwatch_probe_success", key) == 0, key
        assert value(scrape, "stallwatch_probe_http_status_code", key) == code, key
        assert value(scrape, "stallwatch_probe_failures_total", key, reason=reason) >= 1, key
    assert 0.9 < value(scrape, "stallwatch_probe_duration_seconds", "hang") < 10  # cut at its 1 s timeout
    assert value(scrape, "stallwatch_probe_last_success_timestamp_seconds", "503") is None
    assert value(scrape, "stallwatch_server_up", "ok") is None  # not a probe series
    assert scrape.value("stallwatch_server_up", server="probed") == 0  # no such process


def test_promtool_check_metrics_on_live_scrape(exporter, engine, tmp_path: Path) -> None:
    from support.transcripts import sglang_until_shards

    promtool = require("promtool")
    sim = engine("sglang", sglang_until_shards(tp=2), tp=2)
    e = exporter(nvml={"gpus": gpus(2)})
    scrape = e.wait_for(lambda s: s.value("stallwatch_server_up", server=sim.name) == 1 and
                        s.probe("stallwatch_probe_success", server=sim.name,
                                url=f"http://127.0.0.1:{sim.port}/health") is not None and s)
    result = subprocess.run([promtool, "check", "metrics"], input=scrape.text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    # What a live scrape emits is documented (the catalog test covers the converse).
    emitted = {line.split()[2] for line in scrape.text.splitlines() if line.startswith("# TYPE ")}
    assert emitted - documented() == set()


def test_phase_changes_are_dated_at_the_event_not_at_the_next_scrape(exporter, engine) -> None:
    from support.transcripts import sglang_until_shards

    sim = engine("sglang", sglang_until_shards(tp=1, shards=8), final="stall", tp=1)
    e = exporter(config="discovery: {enabled: true, interval: 1s}\nlogs: {poll_interval: 0.2s}\n")
    e.wait_for(lambda s: s.value("stallwatch_startup_phase", server=sim.name, phase="loading_weights") == 1)
    sim.stop()
    gone = time.time()
    time.sleep(4)  # no scrape meanwhile: the watcher's liveness check alone must see the process go
    scrape = e.scrape()
    assert scrape.value("stallwatch_startup_phase", server=sim.name, phase="stopped") == 1
    assert gone - 0.5 <= scrape.value("stallwatch_startup_phase_start_timestamp_seconds", server=sim.name) <= gone + 2
