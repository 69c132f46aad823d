"""Reach a server's port when it lives in another network namespace (a pod, a container).

`127.0.0.1:<port>` from the exporter is the wrong place for a server in a pod: its loopback is not ours.
Everything here reads `/proc/PID/net/*`, which shows the *target's* namespace (torvalds/linux
`fs/proc/proc_net.c`, `get_proc_task_net()` takes `task->nsproxy->net_ns`) and is world-readable
(`fs/proc/base.c`, `DIR("net", S_IRUGO|S_IXUGO, ...)`), so discovery needs no privilege. psutil reads the
caller's `/proc/net` instead and misses such sockets (giampaolo/psutil#1611), hence the parser below.

Only `run_in_netns` needs a capability (CAP_SYS_ADMIN, setns(2)); it is the last resort for servers that
bind 127.0.0.1 inside their namespace (SGLang's and llama.cpp's default).

Everything read here comes from other users' processes: the readers never raise, they return None / []. Paths and
opens go through `stallwatch.procfs`; who made a namespace is `discovery.namespaces`.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from stallwatch import procfs as proc
from stallwatch.discovery import namespaces

__all__ = [
    "CLONE_NEWNET",
    "PROBE_THREAD_PREFIX",
    "TCP_LISTEN",
    "Socket",
    "choose_address",
    "listeners",
    "listening",
    "local_addresses",
    "netns_inode",
    "parse_tcp",
    "run_in_netns",
    "same_netns",
    "socket_inodes",
]

T = TypeVar("T")

TCP_LISTEN = 0x0A  # include/net/tcp_states.h TCP_LISTEN
CLONE_NEWNET = 0x40000000  # include/uapi/linux/sched.h
_IFA_F_DADFAILED = 0x08  # include/uapi/linux/if_addr.h: the address can never be used

_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_HEX2 = re.compile(r"[0-9A-Fa-f]{2}")
_HEX8 = re.compile(r"[0-9A-Fa-f]{8}")
_HEX32 = re.compile(r"[0-9A-Fa-f]{32}")
_HEXFLAGS = re.compile(r"[0-9A-Fa-f]{1,8}")
_SLOT = re.compile(r"[0-9]+:")
_INODE = re.compile(r"[0-9]{1,20}")
_SOCKET_LINK = re.compile(r"socket:\[([0-9]{1,20})\]")

PROBE_THREAD_PREFIX = "stallwatch-netns-probe"


@dataclass(frozen=True)
class Socket:
    """One row of `/proc/PID/net/tcp{,6}`: the local end and its state.

    `address` is `ipaddress` text. An IPv4-mapped IPv6 bind (`::ffff:10.0.0.1`) is given as the IPv4 text
    (`10.0.0.1`) and no flag is kept: such a socket accepts only IPv4 connections to that address, so for
    a prober it *is* that IPv4 address, and "wildcard / loopback only / address X" reads the same from
    either table. `::` stays `::` (a dual-stack wildcard under the default `net.ipv6.bindv6only=0`).
    """

    address: str
    port: int
    state: int
    inode: int


def _word_bytes(hex_words: str) -> bytes:
    """Address bytes from the kernel's `%08X` words.

    The kernel prints each 32-bit word of the network-order address as a host-order integer
    (Documentation/networking/proc_net_tcp.rst: "little-endian" on x86), so packing each word back in
    native order restores the network-order bytes on any host.
    """
    return b"".join(struct.pack("=I", int(hex_words[i : i + 8], 16)) for i in range(0, len(hex_words), 8))


def _address_text(hex_words: str) -> str:
    """`ipaddress` text of a hex address; IPv4-mapped IPv6 becomes the IPv4 text (see `Socket`)."""
    raw = _word_bytes(hex_words)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    v6 = ipaddress.IPv6Address(raw)
    return str(v6.ipv4_mapped) if v6.ipv4_mapped is not None else str(v6)


def _parse_line(line: str, ipv6: bool) -> Socket | None:
    """One table row, or None for the header and anything malformed.

    Columns: `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...`
    (net/ipv4/tcp_ipv4.c `get_tcp4_sock`, net/ipv6/tcp_ipv6.c `get_tcp6_sock`).
    """
    fields = line.split()
    if len(fields) < 10 or not _SLOT.fullmatch(fields[0]):
        return None
    addr_hex, sep, port_hex = fields[1].partition(":")
    addr_ok = (_HEX32 if ipv6 else _HEX8).fullmatch(addr_hex)
    if not (sep and addr_ok and _HEX4.fullmatch(port_hex)):
        return None
    if not (_HEX2.fullmatch(fields[3]) and _INODE.fullmatch(fields[9])):
        return None
    return Socket(_address_text(addr_hex), int(port_hex, 16), int(fields[3], 16), int(fields[9]))


def parse_tcp(text: str, ipv6: bool) -> list[Socket]:
    """All well-formed rows of a `/proc/net/tcp` (`ipv6=False`) or `tcp6` (`ipv6=True`) text; never raises."""
    return [s for line in text.splitlines() if (s := _parse_line(line, ipv6)) is not None]


def _pid_dir(procfs: str, pid: int | str) -> str | None:
    """`procfs.pid_dir`, or None when `pid` is not a pid, `self` or `thread-self` (no path tricks)."""
    try:
        return proc.pid_dir(procfs, pid)
    except ValueError:
        return None


def _text(line: bytes) -> str:
    """Decode one line of a procfs file.

    Bytes, not a text-mode file: `bytes.decode("ascii")` takes CPython's built-in fast path, while `open(...,
    encoding=...)` imports a codec module on first use, which fails once privileges are dropped and the
    interpreter's own files are no longer readable.
    """
    return line.decode("ascii", "replace")


def _listeners(path: str, ipv6: bool, port: int) -> list[Socket] | None:
    """LISTEN rows on `port` in one table (streamed: busy servers have huge tables), None if unreadable."""
    try:
        rows = (_parse_line(_text(line), ipv6) for line in proc.lines(path))
        return [s for s in rows if s is not None and s.state == TCP_LISTEN and s.port == port]
    except (OSError, ValueError):
        return None


def listeners(procfs: str, pid: int, port: int) -> list[Socket] | None:
    """The LISTEN sockets on `port` in `pid`'s network namespace, IPv4 table first.

    `[]` when nothing listens (TIME_WAIT and ESTABLISHED rows on the port do not count); None when neither
    `tcp` nor `tcp6` can be read (the process is gone, or procfs hides it).
    """
    base = _pid_dir(procfs, pid)
    if base is None:
        return None
    tables = [_listeners(os.path.join(base, "net", name), ipv6, port) for name, ipv6 in (("tcp", False),
                                                                                         ("tcp6", True))]
    if all(table is None for table in tables):
        return None
    return [s for table in tables for s in table or ()]


def listening(procfs: str, pid: int, port: int) -> list[str] | None:
    """Local addresses with a LISTEN socket on `port` in `pid`'s network namespace (see `listeners`),
    duplicates dropped (SO_REUSEPORT workers)."""
    found = listeners(procfs, pid, port)
    return None if found is None else list(dict.fromkeys(s.address for s in found))


def socket_inodes(procfs: str, pids: Iterable[int]) -> set[int] | None:
    """Inodes of the sockets that `pids` hold open, from their `/proc/PID/fd/N` links (`socket:[INODE]`); None when
    not one of their fd folders could be read.

    Reading another user's fd links needs the ptrace-read check (root or CAP_SYS_PTRACE): a process that
    cannot be read contributes nothing, so a socket is only ever credited to a process seen holding it.
    """
    found: set[int] = set()
    read = False
    for pid in pids:
        base = _pid_dir(procfs, pid)
        if base is None:
            continue
        fd_dir = os.path.join(base, "fd")
        try:
            names = os.listdir(fd_dir)
        except (OSError, ValueError):
            continue
        read = True
        for name in names:
            try:
                match = _SOCKET_LINK.fullmatch(os.readlink(os.path.join(fd_dir, name)))
            except (OSError, ValueError):
                continue
            if match:
                found.add(int(match.group(1)))
    return found if read else None


def _read_lines(path: str) -> Iterable[str]:
    """The file's lines, or nothing when it cannot be read; never raises."""
    try:
        yield from (_text(line) for line in proc.lines(path))
    except (OSError, ValueError):
        return


def _fib_local_v4(lines: Iterable[str]) -> list[str]:
    """Non-loopback IPv4 addresses from the `/32 host LOCAL` leaves of a `fib_trie` dump.

    A leaf (`|-- 198.18.0.2`) is followed by one line per prefix (`/32 host LOCAL`, possibly ` tos=N`)
    (net/ipv4/fib_trie.c `fib_trie_seq_show`). The Main and Local tables repeat the leaves: deduplicated.
    """
    found: list[str] = []
    leaf: str | None = None
    for line in lines:
        text = line.strip()
        if text.startswith("|--"):
            leaf = text[3:].strip()
        elif text.startswith("+--") or text.endswith(":"):
            leaf = None  # an inner node or a table header ends the leaf
        elif leaf is not None and text.split()[:3] == ["/32", "host", "LOCAL"]:
            try:
                address = ipaddress.IPv4Address(leaf)
            except ValueError:
                continue
            if not (address.is_loopback or address.is_unspecified) and str(address) not in found:
                found.append(str(address))
    return found


def _inet6_global(lines: Iterable[str]) -> list[str]:
    """IPv6 addresses from `if_inet6` rows (`addr ifindex plen scope flags name`, net/ipv6/addrconf.c
    `if6_seq_show`), without `::1`, link-local `fe80::/10` and addresses whose DAD failed."""
    found: list[str] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or not _HEX32.fullmatch(fields[0]) or not _HEXFLAGS.fullmatch(fields[4]):
            continue
        if int(fields[4], 16) & _IFA_F_DADFAILED:
            continue
        address = ipaddress.IPv6Address(bytes.fromhex(fields[0]))
        if address.is_loopback or address.is_link_local or address.is_unspecified or address.is_multicast:
            continue
        if str(address) not in found:
            found.append(str(address))
    return found


def local_addresses(procfs: str, pid: int) -> list[str]:
    """The addresses of `pid`'s network namespace that another namespace could dial: IPv4 first, then IPv6.

    IPv4 from `<procfs>/<pid>/net/fib_trie`, IPv6 from `<procfs>/<pid>/net/if_inet6`; both world-readable,
    so this finds a pod IP without the API server. Unreadable files give `[]`; never raises.
    """
    base = _pid_dir(procfs, pid)
    if base is None:
        return []
    v4 = _fib_local_v4(_read_lines(os.path.join(base, "net", "fib_trie")))
    return v4 + _inet6_global(_read_lines(os.path.join(base, "net", "if_inet6")))


def netns_inode(procfs: str, pid: int | str) -> int | None:
    """Inode of `pid`'s network namespace (`pid` may be `"self"`), None when missing or denied.

    Stat of `<procfs>/<pid>/ns/net` needs the ptrace-read check (same uid or CAP_SYS_PTRACE;
    torvalds/linux `fs/proc/namespaces.c` `proc_ns_get_link`), unlike `net/tcp`.
    """
    return None if _pid_dir(procfs, pid) is None else namespaces.inode(procfs, pid, "net")


def same_netns(procfs: str, pid: int) -> bool | None:
    """Whether `pid` shares the exporter's network namespace (then `127.0.0.1` is right); None = unknown.

    "The exporter's" is `<procfs>/self`, the process (thread-group leader), so a probe thread that
    entered another namespace does not change the answer.
    """
    ours = netns_inode(procfs, "self")
    theirs = netns_inode(procfs, pid)
    if ours is None or theirs is None:
        return None
    return ours == theirs


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address, or None for anything that is not one."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _dialable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address another namespace can dial without a scope id: not wildcard, loopback or link-local."""
    return not (address.is_unspecified or address.is_loopback or address.is_link_local or address.is_multicast)


def choose_address(binds: list[str], own: list[str]) -> tuple[str, str]:
    """Where to dial a server from the exporter's namespace, given its LISTEN addresses and its namespace's own.

    Returns `(kind, address)` (address as `ipaddress` text; bracket IPv6 in URLs yourself):
    - `("address", X)`: a bind to a specific dialable address X (IPv4 preferred), else for a wildcard
      bind the first dialable address in `own`: IPv4 preferred, IPv6 only when the bind is `::`
      (a `0.0.0.0` socket never answers IPv6). Kubelet probes dial the pod IP the same way
      (k8s.io/api core/v1 `HTTPGetAction.Host`: "defaults to the pod IP").
    - `("loopback_only", L)`: only reachable through setns (`run_in_netns`): L is the loopback bind itself
      (normally `127.0.0.1` or `::1`), or for a wildcard bind in a namespace with no other address
      `127.0.0.1` (`::1` when the only wildcard is `::`).
    - `("none", "")`: nothing usable listens.
    Pure: no I/O; invalid strings are ignored.
    """
    addresses = [a for a in (_ip(b) for b in binds) if a is not None]
    specific = [a for a in addresses if _dialable(a)]
    if specific:
        return "address", str(min(specific, key=lambda a: a.version))  # min is stable: first IPv4, else first
    wildcards = {a.version for a in addresses if a.is_unspecified}
    if wildcards:
        mine = [a for a in (_ip(o) for o in own) if a is not None and _dialable(a)]
        usable = [a for a in mine if a.version == 4 or 6 in wildcards]
        if usable:
            return "address", str(min(usable, key=lambda a: a.version))
        return "loopback_only", "127.0.0.1" if 4 in wildcards else "::1"
    loopback = [a for a in addresses if a.is_loopback]
    if loopback:
        return "loopback_only", str(min(loopback, key=lambda a: a.version))
    return "none", ""


@functools.lru_cache(maxsize=1)
def _libc_setns() -> Callable[[int, int], int]:
    """libc's `setns(int fd, int nstype)`; Python has `os.setns` only from 3.12."""
    func = ctypes.CDLL(None, use_errno=True).setns
    func.argtypes = (ctypes.c_int, ctypes.c_int)
    func.restype = ctypes.c_int
    return func  # type: ignore[no-any-return]


def _setns_thread(fd: int) -> None:
    """Move the *calling thread* into the network namespace of `fd` (setns(2) affects one thread)."""
    try:
        setns = _libc_setns()
    except (OSError, AttributeError) as err:
        raise OSError(38, f"setns unavailable: {err}") from err  # ENOSYS
    if setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"setns(CLONE_NEWNET): {os.strerror(code)}")  # EPERM gives PermissionError


def run_in_netns(procfs: str, pid: int, fn: Callable[[], T], timeout: float) -> T:
    """Run `fn` inside `pid`'s network namespace and return its result (for a loopback-only server).

    `fn` runs in a new, dedicated daemon thread that first calls `setns(fd, CLONE_NEWNET)`; sockets it
    creates stay in that namespace for their whole life. The thread serves nothing else and ends with
    `fn` (its namespace is never restored, so it must never be reused). Only the network namespace
    changes: files, DNS config and mounts are still the exporter's. Same as `nsenter -t PID -n`.

    Needs CAP_SYS_ADMIN (setns(2)) and the ptrace-read check to open `<procfs>/<pid>/ns/net`.
    Raises: `fn`'s own exception; `PermissionError`/`FileNotFoundError`/`OSError` when the namespace file
    cannot be opened or setns fails (errno text in the message); `TimeoutError` when `fn` has not returned
    after `timeout` seconds: the thread is left to finish on its own, so `fn` must bound its own I/O
    (socket timeouts); `ValueError` for a bad `pid` or a timeout that is not a positive number.
    """
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    fd = proc.open_namespace(procfs, pid, "net")  # ValueError for a bad pid
    values: list[T] = []
    errors: list[BaseException] = []

    def probe() -> None:
        try:
            try:
                _setns_thread(fd)
            finally:
                os.close(fd)
            values.append(fn())
        except BaseException as err:  # handed to the caller, re-raised there
            errors.append(err)

    thread = threading.Thread(target=probe, name=f"{PROBE_THREAD_PREFIX}-{pid}", daemon=True)
    try:
        thread.start()
    except BaseException:
        os.close(fd)  # the thread never ran, so it never took the descriptor
        raise
    thread.join(min(timeout, threading.TIMEOUT_MAX))
    if thread.is_alive():
        raise TimeoutError(f"probe in the network namespace of pid {pid} still running after {timeout:g}s")
    if errors:
        raise errors[0]
    return values[0]
