"""The test sandboxes themselves: pods, containers and units look to the exporter as the real ones do."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import sandbox, transcripts
from support.harness import poll
from support.sandbox import DockerContainer, Pod, SystemdUnit, join_cri, read_cri, require_root

SHIM = [sys.executable, str(sandbox.SHIM)]


RFC3339NANO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$")


CONMON_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}[+-]\d\d:\d\d$")


LONG = "x" * 40 * 1024


@pytest.fixture
def stack() -> Iterator[contextlib.ExitStack]:
    with contextlib.ExitStack() as resources:
        yield resources


def lines_of(transcript: str) -> list[str]:
    """The lines a CRI reader gets back: split on LF, a CR before LF stripped (containerd)."""
    return [line.removesuffix("\r") for line in transcript.split("\n")[:-1]]


def cgroup_lines(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cgroup").read_text().splitlines()


def expected_lines(pid: int) -> list[str]:
    """The /proc/PID/cgroup lines of the hierarchies the sandbox creates cgroups in."""
    wanted = []
    for line in cgroup_lines(pid):
        ident, controllers, _path = line.split(":", 2)
        for hierarchy in sandbox.cgroup_hierarchies():
            if (hierarchy.version == 2 and ident == "0") or hierarchy.controller in controllers.split(","):
                wanted.append(line)
    assert wanted, cgroup_lines(pid)
    return wanted


def children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
    return found


def http_status(url: str) -> int:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy from env
    with direct.open(url, timeout=2) as response:
        return response.status


def run_shim(tmp_path: Path, fmt: str, script: str, *extra: str) -> tuple[int, Path]:
    log = tmp_path / f"{fmt}.log"
    done = subprocess.run([*SHIM, "--format", fmt, "--log", str(log), *extra, "--", "sh", "-c", script],
                          capture_output=True, timeout=15)
    return done.returncode, log


def test_cgroup_paths_have_the_runtimes_shapes() -> None:
    uid, cid = "1234abcd-0000-4000-8000-00000000beef", "ab" * 32
    assert sandbox.kubepods_systemd("burstable", uid, cid) == (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234abcd_0000_4000_8000_00000000beef.slice/"
        f"cri-containerd-{cid}.scope")
    assert sandbox.kubepods_systemd("guaranteed", uid, cid, runtime="crio") == (
        f"kubepods.slice/kubepods-pod1234abcd_0000_4000_8000_00000000beef.slice/crio-{cid}.scope")
    assert sandbox.kubepods_cgroupfs("besteffort", uid, cid) == f"kubepods/besteffort/pod{uid}/{cid}"
    assert sandbox.docker_systemd(cid) == f"system.slice/docker-{cid}.scope"
    assert sandbox.systemd_unit("sglang.service") == "system.slice/sglang.service"


def test_hierarchies_are_found_in_mountinfo_wherever_mounted(tmp_path: Path) -> None:
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
        "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n")
    found = {(str(h.mountpoint), h.version, h.controller) for h in sandbox.cgroup_hierarchies(str(hybrid))}
    assert found == {("/sys/fs/cgroup/pids", 1, "pids"), ("/sys/fs/cgroup/systemd", 1, "name=systemd"),
                     ("/sys/fs/cgroup/unified", 2, "")}
    pure = tmp_path / "pure"
    pure.write_text("29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
                    "30 29 0:27 / /host\\040dir rw - cgroup2 cgroup2 rw\n")
    assert [(str(h.mountpoint), h.version) for h in sandbox.cgroup_hierarchies(str(pure))] == [("/sys/fs/cgroup", 2)]


def test_require_root_skips_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox._root_problem.cache_clear()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    try:
        with pytest.raises(pytest.skip.Exception, match="need root"):
            require_root()
    finally:
        sandbox._root_problem.cache_clear()


@pytest.mark.process
def test_shim_writes_containerd_cri_records(tmp_path: Path) -> None:
    script = f"printf 'one\\r\\n'; echo {LONG}; echo oops >&2; printf 'no newline'; exit 3"
    status, log = run_shim(tmp_path, "cri", script)
    assert status == 3
    records = read_cri(log)
    assert all(RFC3339NANO.match(stamp) for stamp, *_ in records), records[0]
    stdout = [(tag, len(content)) for _t, stream, tag, content in records if stream == "stdout"]
    assert stdout == [("F", 3), ("P", 16384), ("P", 16384), ("F", 8192), ("P", 10)]
    assert join_cri(records) == ["one", LONG]
    assert join_cri(records, "stderr") == ["oops"]


@pytest.mark.process
def test_shim_writes_conmon_records_per_read(tmp_path: Path) -> None:
    status, log = run_shim(tmp_path, "crio", f"echo short; echo {LONG}")
    assert status == 0
    records = read_cri(log)
    assert all(CONMON_TIME.match(stamp) for stamp, *_ in records), records[0]
    assert records[0][2:] == ("F", "short")
    assert [tag for _t, _s, tag, _c in records[1:]][-1] == "F"
    assert all(len(content) <= 8192 for *_x, content in records)
    assert join_cri(records) == ["short", LONG]


@pytest.mark.process
def test_shim_writes_docker_json_file_records(tmp_path: Path) -> None:
    status, log = run_shim(tmp_path, "docker", f"printf 'a<b>&\\tc\\n'; echo {LONG}; printf 'tail'")
    assert status == 0
    raw = log.read_text().splitlines()
    assert raw[0].startswith('{"log":"a\\u003cb\\u003e\\u0026\\u0009c\\n","stream":"stdout","time":"'), raw[0]
    entries = [json.loads(line) for line in raw]
    assert all(list(e) == ["log", "stream", "time"] and RFC3339NANO.match(e["time"]) for e in entries)
    assert [len(e["log"]) for e in entries[1:]] == [16384, 16384, 8192 + 1, 4]
    assert entries[1]["time"] == entries[2]["time"] == entries[3]["time"]  # one partial message, one time
    assert not entries[1]["log"].endswith("\n") and entries[3]["log"].endswith("\n")
    assert "".join(e["log"] for e in entries[1:4]) == LONG + "\n"
    assert entries[4]["log"] == "tail"


@pytest.mark.process
def test_shim_writes_journal_entries_on_a_stream_socket(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = 'echo "$JOURNAL_STREAM"; stat -L -c %d:%i /proc/self/fd/1; readlink /proc/$$/fd/2'
    status, log = run_shim(tmp_path, "journal", script, "--unit", "llm.service", "--pidfile", str(pidfile))
    assert status == 0
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    stream, stat, fd2 = (e["MESSAGE"] for e in entries)
    assert stream == stat and fd2.startswith("socket:[")  # stdout and stderr: the one journald stream
    assert {e["_SYSTEMD_UNIT"] for e in entries} == {"llm.service"}
    assert {e["_PID"] for e in entries} == {pidfile.read_text().strip()}
    assert len({e["__CURSOR"] for e in entries}) == 3
    assert all(re.match(r"^s=[0-9a-f]{32};i=[0-9a-f]+;b=", e["__CURSOR"]) for e in entries)


@pytest.mark.process
def test_shim_reopens_on_sigusr1_and_forwards_sigterm(tmp_path: Path) -> None:
    log, pidfile = tmp_path / "0.log", tmp_path / "pid"
    script = 'trap "echo bye; exit 7" TERM; i=0; while :; do echo "n$i"; i=$((i+1)); sleep 0.05; done'
    shim = subprocess.Popen([*SHIM, "--format", "cri", "--log", str(log), "--pidfile", str(pidfile),
                             "--", "sh", "-c", script])
    try:
        poll(lambda: len(read_cri(log)) >= 2, what="first records")
        log.rename(tmp_path / "0.log.rotated")
        shim.send_signal(signal.SIGUSR1)
        poll(lambda: log.exists() and len(read_cri(log)) >= 2, what="records in the reopened log")
        shim.send_signal(signal.SIGTERM)
        assert shim.wait(10) == 7
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        shim.kill()
        shim.wait()
    before, after = join_cri(read_cri(tmp_path / "0.log.rotated")), join_cri(read_cri(log))
    numbers = [int(line[1:]) for line in before + after[:-1]]
    assert numbers == list(range(len(numbers)))  # nothing lost or doubled across the reopen
    assert after[-1] == "bye"


@pytest.mark.root
def test_cgroup_add_and_removal_with_a_process_left_inside() -> None:
    relative = f"stallwatch-test-{os.getpid()}.slice/leaf.scope"
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with sandbox.Cgroup(relative) as cgroup:
            cgroup.add(sleeper.pid)
            for line in expected_lines(sleeper.pid):
                assert line.endswith(f"/{relative}"), line
            assert cgroup.pids() == {sleeper.pid}
        assert not any(d.exists() or d.parent.exists() for d in cgroup.dirs)
        assert sleeper.poll() is None and all(not line.endswith(relative) for line in cgroup_lines(sleeper.pid))
        with pytest.raises(FileExistsError), sandbox.Cgroup(relative), sandbox.Cgroup(relative):
            pass  # never adopt an existing leaf
        assert not any(d.exists() for d in cgroup.dirs)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.root
def test_pod_looks_like_a_kubernetes_container(tmp_path: Path, stack: contextlib.ExitStack) -> None:
    text = transcripts.sglang_until_shards(tp=2, shards=4) + LONG + "\n" + "crlf line\r\n"
    pod = stack.enter_context(Pod(tmp_path, "sglang", text, namespace="ml", pod="kimi-0", container="engine", tp=2))
    uid = pod.pod_uid.replace("-", "_")
    for line in expected_lines(pod.pid):
        assert line.endswith(f"/kubepods-burstable-pod{uid}.slice/cri-containerd-{pod.container_id}.scope"), line
    kids = poll(lambda: children(pod.pid) if len(children(pod.pid)) >= 3 else None, what="engine children")
    assert kids | {pod.pid} <= pod.cgroup.pids()
    assert pod.shim_pid not in pod.cgroup.pids()  # the shim runs outside the container, as in real life
    assert "launch_server" not in Path(f"/proc/{pod.shim_pid}/cmdline").read_text()
    out, err = (os.readlink(f"/proc/{pod.pid}/fd/{fd}") for fd in (1, 2))
    assert out.startswith("pipe:[") and err.startswith("pipe:[") and out != err
    assert os.readlink(f"/proc/{pod.pid}/ns/net") != os.readlink("/proc/self/ns/net")

    poll(lambda: join_cri(read_cri(pod.log_path)) == lines_of(text), what="the transcript in the CRI log")
    records = read_cri(pod.log_path)
    assert all(RFC3339NANO.match(stamp) for stamp, *_ in records)
    assert [(tag, len(c)) for _t, _s, tag, c in records if len(c) >= 8192] == [("P", 16384), ("P", 16384),
                                                                               ("F", 8192)]
    assert pod.log_node_path == f"/var/log/pods/ml_kimi-0_{pod.pod_uid}/engine/0.log"
    assert pod.symlink_path == tmp_path / f"root/var/log/containers/kimi-0_ml_engine-{pod.container_id}.log"
    assert os.readlink(pod.symlink_path) == pod.log_node_path
    assert pod.name == "ml/kimi-0" and pod.port == 30000


@pytest.mark.root
def test_rotation_and_restart_follow_the_kubelet(tmp_path: Path, stack: contextlib.ExitStack) -> None:
    text = "".join(f"line {i}\n" for i in range(40))
    pod = stack.enter_context(Pod(tmp_path, "vllm", text, tp=1, port=8000, line_delay=0.03))
    poll(lambda: len(read_cri(pod.log_path)) >= 5, what="first lines")
    first = pod.rotate()
    assert re.fullmatch(r"0\.log\.\d{8}-\d{6}", first.name)
    poll(lambda: len(read_cri(first)) + len(read_cri(pod.log_path)) == 40, what="the rest of the lines")
    assert read_cri(pod.log_path), "the fresh 0.log gets the later lines"
    assert join_cri(read_cri(first)) + join_cri(read_cri(pod.log_path)) == lines_of(text)
    second = pod.rotate(when=time.time() + 1)
    assert not first.exists() and gzip.decompress(Path(f"{first}.gz").read_bytes()).count(b"\n") >= 5
    assert second.exists() and pod.log_path.exists()

    old_id, old_pid, old_link, old_cgroup = pod.container_id, pod.pid, pod.symlink_path, pod.cgroup.dirs
    again = transcripts.vllm_healthy(tp=1)
    pod.restart(again, final="serve")
    assert pod.restart_count == 1 and pod.log_node_path.endswith("/vllm/1.log")
    assert pod.container_id != old_id and pod.pid != old_pid
    assert os.readlink(pod.symlink_path) == pod.log_node_path
    assert os.readlink(old_link).endswith("/0.log")  # kubelet keeps the last dead container's link
    assert not any(d.exists() for d in old_cgroup)
    assert all(line.endswith(f"cri-containerd-{pod.container_id}.scope") for line in expected_lines(pod.pid))
    poll(lambda: join_cri(read_cri(pod.log_path)) == lines_of(again), what="the new container's log")
    assert poll(lambda: http_status(f"http://{pod.address}:8000/health"), what="health after restart") == 200


@pytest.mark.root
def test_two_pods_serve_on_the_same_port(tmp_path: Path, stack: contextlib.ExitStack) -> None:
    text = transcripts.sglang_healthy(tp=1)
    pods = [stack.enter_context(Pod(tmp_path, "sglang", text, final="serve", tp=1)),
            stack.enter_context(Pod(tmp_path, "sglang", text, final="serve", tp=1, fmt="crio",
                                    cgroup_driver="cgroupfs", qos="guaranteed"))]
    assert pods[0].address != pods[1].address
    for line in expected_lines(pods[1].pid):
        assert line.endswith(f"/kubepods/pod{pods[1].pod_uid}/crio-{pods[1].container_id}"), line
    poll(lambda: read_cri(pods[1].log_path), what="CRI-O records")
    assert CONMON_TIME.match(read_cri(pods[1].log_path)[0][0])
    for pod in pods:
        assert re.fullmatch(r"198\.1[89]\.\d+\.\d+", pod.address)
        url = f"http://{pod.address}:30000/health"
        assert poll(lambda url=url: http_status(url), timeout=15, what=url) == 200
        listen = [row.split() for row in Path(f"/proc/{pod.pid}/net/tcp").read_text().splitlines()[1:]]
        assert ["00000000:7530", "0A"] in [[r[1], r[3]] for r in listen]  # 0.0.0.0:30000 LISTEN in its netns


@pytest.mark.root
def test_docker_json_file_container(tmp_path: Path, stack: contextlib.ExitStack) -> None:
    text = transcripts.sglang_until_shards(tp=1, shards=2) + LONG + "\n"
    box = stack.enter_context(DockerContainer(tmp_path, "sglang", text, name="kimi", tp=1))
    assert box.log_path == tmp_path / f"root/var/lib/docker/containers/{box.container_id}/{box.container_id}-json.log"
    for line in expected_lines(box.pid):
        assert line.endswith(f"/system.slice/docker-{box.container_id}.scope"), line
    config = json.loads((box.directory / "config.v2.json").read_text())
    assert config["ID"] == box.container_id and config["Name"] == "/kimi" and config["State"]["Pid"] == box.pid
    assert config["NetworkSettings"]["Networks"]["bridge"]["IPAddress"] == box.address
    hostconfig = json.loads((box.directory / "hostconfig.json").read_text())
    assert hostconfig["LogConfig"] == {"Type": "json-file", "Config": {}}

    def joined() -> list[str]:
        lines, partial = [], ""
        for raw in box.log_path.read_text().splitlines():
            partial += json.loads(raw)["log"]
            if partial.endswith("\n"):
                lines.append(partial[:-1])
                partial = ""
        return lines

    poll(lambda: joined() == text.split("\n")[:-1], what="the transcript in the json-file log")
    sizes = [len(json.loads(raw)["log"]) for raw in box.log_path.read_text().splitlines()]
    assert sizes[-3:] == [16384, 16384, 8192 + 1]


@pytest.mark.root
def test_docker_local_driver_writes_nothing_readable(tmp_path: Path, stack: contextlib.ExitStack) -> None:
    box = stack.enter_context(DockerContainer(tmp_path, "llamacpp", transcripts.llamacpp_healthy(), tp=1,
                                              port=8080, netns=False, driver="local"))
    assert box.log_path is not None and box.log_path.name == "container.log"
    assert not list(box.directory.glob("*-json.log"))
    data = poll(lambda: box.log_path.read_bytes(), what="local-format frames")
    size = int.from_bytes(data[:4], "big")
    assert data[4 + size : 8 + size] == data[:4]  # length header and footer around one protobuf entry
    assert box.address == "127.0.0.1" and "host" in json.loads((box.directory / "config.v2.json").read_text())[
        "NetworkSettings"]["Networks"]


@pytest.mark.root
def test_systemd_unit_logs_to_the_journal(tmp_path: Path, stack: contextlib.ExitStack) -> None:
    text = transcripts.sglang_until_shards(tp=1, shards=2)
    name = f"kimi-{os.getpid()}.service"  # unique: concurrent runs must not share a unit's cgroup
    unit = stack.enter_context(SystemdUnit(tmp_path, "sglang", text, unit=name, tp=1))
    assert unit.env == {"STALLWATCH_FAKE_JOURNAL": str(tmp_path / "journal.json")}
    for line in expected_lines(unit.pid):
        assert line.endswith(f"/system.slice/{name}"), line
    assert os.readlink(f"/proc/{unit.pid}/fd/1").startswith("socket:[")
    assert os.readlink(f"/proc/{unit.pid}/ns/net") == os.readlink("/proc/self/ns/net")
    poll(lambda: [e["MESSAGE"] for e in unit.journal_entries()] == text.split("\n")[:-1], what="journal entries")
    entries = unit.journal_entries()
    assert {(e["_SYSTEMD_UNIT"], e["_PID"]) for e in entries} == {(name, str(unit.pid))}
    stamps = [int(e["__REALTIME_TIMESTAMP"]) for e in entries]
    assert stamps == sorted(stamps) and len({e["__CURSOR"] for e in entries}) == len(entries)


@pytest.mark.root
def test_everything_is_removed_when_a_test_fails(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), Pod(tmp_path, "sglang", "hello\n", tp=1) as pod:
        netns, cgroup_dirs, pid, shim = pod.netns, pod.cgroup.dirs, pod.pid, pod.shim_pid
        assert netns is not None and all(d.is_dir() for d in cgroup_dirs)
        _ = 1 / 0
    assert not any(d.exists() for d in cgroup_dirs)
    assert netns.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", netns.host_veth], capture_output=True).returncode != 0
    for gone in (pid, shim):
        poll(lambda gone=gone: not Path(f"/proc/{gone}").exists() or "Z" in Path(f"/proc/{gone}/stat").read_text()
             .rsplit(")", 1)[1].split()[:1], what=f"process {gone} to end")
