"""Network namespaces: the kernel's TCP tables parsed, a pod's local addresses, the probe target chosen, and
`run_in_netns`'s errors and timeouts."""

from __future__ import annotations

import errno
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from stallwatch.discovery.netns import (
    TCP_LISTEN,
    Socket,
    choose_address,
    listening,
    local_addresses,
    netns_inode,
    parse_tcp,
    run_in_netns,
    same_netns,
    socket_inodes,
)
from support.paths import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "net"


TCP = (FIXTURES / "tcp").read_text()


TCP6 = (FIXTURES / "tcp6").read_text()


# The fixtures hold rows as printed by a little-endian kernel, as the kernel documentation's examples do.
little_endian = pytest.mark.skipif(sys.byteorder != "little", reason="fixture rows come from a little-endian host")


TIME_WAIT = 0x06


ESTABLISHED = 0x01


def fake_proc(tmp_path: Path, pid: int | str, files: dict[str, str | bytes]) -> str:
    """A procfs tree `<tmp>/proc/<pid>/<relpath>` holding `files`; returns the procfs root."""
    root = tmp_path / "proc"
    for rel, content in files.items():
        path = root / str(pid) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    return str(root)


GOOD = "   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 5120002 1 ab 100 0 0"


GARBAGE = [
    "",
    "   ",
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode",
    "   1: 00000000:1F40",  # truncated
    "   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000",
    "   1: 0x000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 0000000G:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 00000000:1F401 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 00000000_1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 000000000:1F4 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 00000000:1F40 00000000:0000 0A0 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 -7 1",
    "   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 \u0663 1",
    "   \u0661: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "   1: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 " + "9" * 21,
    "   x: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 7 1",
    "\x00\x00\x00 \ufffd\ufffd : : : : : : : : : :",
    "1: :: : : : : : : : :",
    "A" * 10000,
]


POD, POD_V6 = "198.18.0.2", "2001:db8:1::2"


@little_endian
def test_parse_tcp_fixture_decodes_every_row() -> None:
    sockets = parse_tcp(TCP, ipv6=False)
    assert len(sockets) == 30  # header skipped, every row kept
    assert sockets[0] == Socket("127.0.0.1", 30000, TCP_LISTEN, 5120001)
    listeners = {(s.address, s.port) for s in sockets if s.state == TCP_LISTEN}
    assert listeners == {
        ("127.0.0.1", 30000),
        ("0.0.0.0", 8000),
        ("198.18.0.2", 9400),
        ("127.0.0.1", 34567),
        ("0.0.0.0", 29500),
    }
    time_wait = [s for s in sockets if s.state == TIME_WAIT]
    assert {(s.address, s.port, s.inode) for s in time_wait} == {
        ("127.0.0.1", 30000, 0),
        ("198.18.0.2", 8000, 0),
        ("198.18.0.2", 12345, 0),
    }
    assert Socket("198.18.0.2", 48812, 0x08, 5120104) in sockets  # CLOSE_WAIT


@little_endian
def test_parse_tcp6_fixture_gives_ipv4_mapped_as_ipv4_text() -> None:
    sockets = parse_tcp(TCP6, ipv6=True)
    assert len(sockets) == 10
    listeners = [(s.address, s.port) for s in sockets if s.state == TCP_LISTEN]
    assert listeners == [
        ("::", 8080),
        ("::", 8000),
        ("::1", 30001),
        ("10.0.0.1", 9000),  # 0000000000000000FFFF00000100000A = ::ffff:10.0.0.1
        ("2001:db8:1::2", 8443),
        ("fe80::d05a:d3ff:fe6a:860a", 9100),
    ]
    assert Socket("198.18.0.2", 8080, ESTABLISHED, 5120407) in sockets


@little_endian
def test_parse_tcp_kernel_documentation_example() -> None:
    # Documentation/networking/proc_net_tcp.rst: 172.16.3.1:40012 -> 172.16.3.3:6000, ESTABLISHED.
    row = (
        "  46: 010310AC:9C4C 030310AC:1770 01 00000150:00000000 01:00000019 00000000  1000        0 54165785 4"
        " cd1e6040 25 4 27 3 -1"
    )
    assert parse_tcp(row, ipv6=False) == [Socket("172.16.3.1", 40012, ESTABLISHED, 54165785)]


def test_parse_tcp_wrong_family_gives_nothing() -> None:
    assert parse_tcp(TCP, ipv6=True) == []
    assert parse_tcp(TCP6, ipv6=False) == []


@pytest.mark.parametrize("garbage", GARBAGE)
def test_parse_tcp_skips_garbage_and_keeps_good_rows(garbage: str) -> None:
    text = "\n".join([garbage, GOOD, garbage])
    assert parse_tcp(text, ipv6=False) == [Socket("0.0.0.0", 8000, TCP_LISTEN, 5120002)]
    assert parse_tcp(garbage, ipv6=False) == []
    assert parse_tcp(garbage, ipv6=True) == []


@little_endian
@pytest.mark.parametrize(
    ("port", "expected"),
    [
        (30000, ["127.0.0.1"]),  # ESTABLISHED and TIME_WAIT rows on 30000 do not add anything
        (8000, ["0.0.0.0", "::"]),  # IPv4 table first
        (8080, ["::"]),  # mapped ESTABLISHED/TIME_WAIT on 8080 do not count
        (12345, []),  # only ESTABLISHED and TIME_WAIT on this port
        (9000, ["10.0.0.1"]),
        (9400, ["198.18.0.2"]),
        (30001, ["::1"]),
        (1, []),
    ],
)
def test_listening_reads_both_tables(tmp_path: Path, port: int, expected: list[str]) -> None:
    procfs = fake_proc(tmp_path, 4242, {"net/tcp": TCP, "net/tcp6": TCP6})
    assert listening(procfs, 4242, port) == expected


@little_endian
def test_listening_with_one_table_missing(tmp_path: Path) -> None:
    v4only = fake_proc(tmp_path / "a", 10, {"net/tcp": TCP})  # IPv6 disabled: no tcp6 file
    assert listening(v4only, 10, 8000) == ["0.0.0.0"]
    v6only = fake_proc(tmp_path / "b", 10, {"net/tcp6": TCP6})
    assert listening(v6only, 10, 8000) == ["::"]
    assert listening(v6only, 10, 30000) == []


def test_listening_none_when_unreadable(tmp_path: Path) -> None:
    procfs = fake_proc(tmp_path, 11, {})
    assert listening(procfs, 11, 8000) is None  # no net/ at all
    assert listening(procfs, 12, 8000) is None  # no such pid
    (tmp_path / "proc/11/net/tcp").mkdir(parents=True)  # reading a directory fails
    (tmp_path / "proc/11/net/tcp6").symlink_to(tmp_path / "nowhere")
    assert listening(procfs, 11, 8000) is None
    (tmp_path / "proc/11/net/tcp6").unlink()
    (tmp_path / "proc/11/net/tcp6").write_text("")
    assert listening(procfs, 11, 8000) == []  # readable and empty is not unknown


def test_socket_inodes_of_the_pids_it_can_read(tmp_path: Path) -> None:
    """Sockets are credited to the processes whose fd links say so; None only when no fd folder could be read (no
    ptrace rights), which the listening reading tells from a tree that holds nothing."""
    procfs = fake_proc(tmp_path, 20, {})
    fds = tmp_path / "proc/20/fd"
    fds.mkdir()
    for fd, target in (("3", "socket:[5120002]"), ("4", "/var/log/x.log"), ("5", "socket:[77]"), ("6", "pipe:[9]")):
        (fds / fd).symlink_to(target)
    fake_proc(tmp_path, 21, {})  # no fd folder: cannot be read
    assert socket_inodes(procfs, [20, 21]) == {5120002, 77}
    assert socket_inodes(procfs, [21, 22]) is None
    (tmp_path / "proc/21/fd").mkdir()
    assert socket_inodes(procfs, [21]) == set()  # read, and holds nothing


@pytest.mark.parametrize("pid", ["../11", "-1", "", "11/net", True, None, 1.5])
def test_listening_rejects_non_pids(tmp_path: Path, pid: object) -> None:
    procfs = fake_proc(tmp_path, 11, {"net/tcp": GOOD})
    assert listening(procfs, 11, 8000) == ["0.0.0.0"]
    assert listening(procfs, pid, 8000) is None  # type: ignore[arg-type]


def test_listening_survives_bad_bytes_and_dedupes(tmp_path: Path) -> None:
    reuseport = GOOD.replace("5120002", "5120009")  # a second SO_REUSEPORT worker on the same address
    content = b"\xff\xfe\x00garbage\n" + GOOD.encode() + b"\n\x80\x81\n" + reuseport.encode() + b"\n"
    procfs = fake_proc(tmp_path, 13, {"net/tcp": content, "net/tcp6": b"\xc3\x28" * 100})
    assert listening(procfs, 13, 8000) == ["0.0.0.0"]


def test_listening_on_the_live_kernel_table() -> None:
    """Our own namespace, no privilege: a real LISTEN row appears and goes; a live connection never counts."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        assert listening("/proc", os.getpid(), port) == ["127.0.0.1"]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        accepted, _ = server.accept()
        server.close()
        assert listening("/proc", os.getpid(), port) == []  # the ESTABLISHED pair is still there
        tcp = parse_tcp(Path("/proc/self/net/tcp").read_text(), ipv6=False)
        assert any(s.port == port and s.state == ESTABLISHED for s in tcp)
        accepted.close()
        client.close()
    finally:
        server.close()


def test_local_addresses_from_a_pod(tmp_path: Path) -> None:
    fib = (FIXTURES / "fib_trie").read_text()
    inet6 = (FIXTURES / "if_inet6").read_text()
    procfs = fake_proc(tmp_path, 20, {"net/fib_trie": fib, "net/if_inet6": inet6})
    # Not 127.0.0.1, not the broadcast 198.18.0.3, not ::1 or fe80::, and 198.18.0.2 once for Main and Local.
    assert local_addresses(procfs, 20) == ["198.18.0.2", "2001:db8:1::2"]
    assert fib.count("198.18.0.2\n") == 2 and "127.0.0.1" in fib and "198.18.0.3" in fib  # the fixture has them
    assert "00000000000000000000000000000001" in inet6 and "fe80" in inet6


def test_local_addresses_one_file_or_none(tmp_path: Path) -> None:
    fib = (FIXTURES / "fib_trie").read_text()
    inet6 = (FIXTURES / "if_inet6").read_text()
    assert local_addresses(fake_proc(tmp_path / "a", 21, {"net/fib_trie": fib}), 21) == ["198.18.0.2"]
    assert local_addresses(fake_proc(tmp_path / "b", 21, {"net/if_inet6": inet6}), 21) == ["2001:db8:1::2"]
    empty = fake_proc(tmp_path / "c", 21, {})
    assert local_addresses(empty, 21) == []
    (tmp_path / "c/proc/21/net/fib_trie").mkdir(parents=True)
    assert local_addresses(empty, 21) == []
    assert local_addresses(empty, "../21") == []  # type: ignore[arg-type]


def test_local_addresses_odd_trie_and_inet6(tmp_path: Path) -> None:
    fib = (
        textwrap.dedent(
            """\
        Id 1000:
          +-- 0.0.0.0/0 2 0 2
             |-- 10.1.2.3
                /24 link UNICAST
                /32 host LOCAL tos=4
             |-- not-an-address
                /32 host LOCAL
             |-- 10.9.9.9
                /32 link BROADCAST
             +-- 10.5.0.0/16 2 0 2
                /32 host LOCAL
             |-- 0.0.0.0
                /32 host LOCAL
             |-- 127.1.2.3
                /32 host LOCAL
        Local:
             |-- 10.1.2.3
                /32 host LOCAL
        """
        )
        + "\xff\x00 |-- \x00\n"
    )
    inet6 = textwrap.dedent(
        """\
        fd000000000000000000000000000bad 02 40 00 88     eth0
        fd000000000000000000000000000001 02 40 00 80     eth0
        ff020000000000000000000000000001 02 80 00 80     eth0
        00000000000000000000000000000000 02 80 00 80     eth0
        fe800000000000000000000000000001 02 40 20 80     eth0
        zz000000000000000000000000000001 02 40 00 80     eth0
        fd000000000000000000000000000002 02 40 00
        fd000000000000000000000000000001 03 40 00 80     net1
        """
    )
    procfs = fake_proc(tmp_path, 22, {"net/fib_trie": fib, "net/if_inet6": inet6})
    # DAD failed (0x08) dropped, duplicates dropped, the tos= suffix accepted, an inner node is no leaf.
    assert local_addresses(procfs, 22) == ["10.1.2.3", "fd00::1"]


def test_netns_inode_of_ourselves() -> None:
    ours = os.stat("/proc/self/ns/net").st_ino
    assert netns_inode("/proc", "self") == ours
    assert netns_inode("/proc", os.getpid()) == ours
    assert same_netns("/proc", os.getpid()) is True


def test_same_netns_on_a_fake_tree(tmp_path: Path) -> None:
    procfs = fake_proc(tmp_path, "self", {"ns/net": "x"})
    fake_proc(tmp_path, 8, {"ns/net": "y"})
    (tmp_path / "proc/7/ns").mkdir(parents=True)
    os.link(tmp_path / "proc/self/ns/net", tmp_path / "proc/7/ns/net")  # same inode = same namespace
    assert netns_inode(procfs, 7) == (tmp_path / "proc/self/ns/net").stat().st_ino
    assert same_netns(procfs, 7) is True
    assert same_netns(procfs, 8) is False
    assert same_netns(procfs, 9) is None  # missing
    assert netns_inode(procfs, 9) is None
    for bad in ("../self", "-1", "", "7/ns", "self/..", True):
        assert netns_inode(procfs, bad) is None  # type: ignore[arg-type]
    (tmp_path / "proc/self/ns/net").unlink()
    assert same_netns(procfs, 7) is None  # our own unknown


@pytest.mark.parametrize(
    ("binds", "own", "expected"),
    [
        ([], [POD], ("none", "")),
        (["not-an-ip", ""], [POD], ("none", "")),
        (["fe80::1"], [POD], ("none", "")),  # link-local needs a scope id: not dialable
        (["0.0.0.0"], [POD], ("address", POD)),
        (["0.0.0.0"], [POD, "198.18.0.6"], ("address", POD)),
        (["0.0.0.0"], ["127.0.0.1", "fe80::1", "junk", POD], ("address", POD)),
        (["::"], [POD_V6, POD], ("address", POD)),  # IPv4 preferred
        (["::"], [POD_V6], ("address", POD_V6)),
        (["0.0.0.0"], [POD_V6], ("loopback_only", "127.0.0.1")),  # a 0.0.0.0 socket never answers IPv6
        (["0.0.0.0", "::"], [POD_V6], ("address", POD_V6)),
        (["0.0.0.0"], [], ("loopback_only", "127.0.0.1")),  # e.g. `--network none`
        (["::"], [], ("loopback_only", "::1")),
        ([POD], [POD], ("address", POD)),
        (["10.0.0.1"], [POD], ("address", "10.0.0.1")),  # the bind itself, even if not in `own`
        ([POD_V6], [], ("address", POD_V6)),
        ([POD_V6, POD], [], ("address", POD)),
        (["127.0.0.1", POD], [POD], ("address", POD)),
        (["0.0.0.0", "10.0.0.1"], [POD], ("address", "10.0.0.1")),
        (["127.0.0.1"], [POD], ("loopback_only", "127.0.0.1")),
        (["::1"], [POD], ("loopback_only", "::1")),
        (["::1", "127.0.0.1"], [POD], ("loopback_only", "127.0.0.1")),
        (["127.0.0.5"], [POD], ("loopback_only", "127.0.0.5")),
    ],
)
def test_probe_target(binds: list[str], own: list[str], expected: tuple[str, str]) -> None:
    assert choose_address(binds, own) == expected


@pytest.mark.parametrize("timeout", [0, -1, float("nan")])
def test_run_in_netns_rejects_bad_timeouts(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        run_in_netns("/proc", os.getpid(), lambda: 1, timeout)


def test_run_in_netns_open_and_setns_errors(tmp_path: Path) -> None:
    called: list[int] = []
    with pytest.raises(ValueError, match="not a pid"):
        run_in_netns("/proc", "../1", lambda: called.append(1), 5)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        run_in_netns(str(tmp_path), 5, lambda: called.append(1), 5)
    procfs = fake_proc(tmp_path, 6, {"ns/net": "not a namespace"})
    with pytest.raises(OSError, match="Invalid argument") as info:
        run_in_netns(procfs, 6, lambda: called.append(1), 5)  # setns refuses a regular file
    assert info.value.errno == errno.EINVAL
    assert called == []  # fn never runs outside the namespace


