"""The sockets: the listening one and the descriptors left for it, and the non-blocking reads and sends of a
connection. `:port` is one dual-stack AF_INET6 socket (IPV6_V6ONLY=0)
where IPv6 exists, else AF_INET, as Go's `net.Listen`; the backlog is capped at `net.core.somaxconn`, as the kernel
would; the connection cap leaves descriptors below RLIMIT_NOFILE for the collections.
"""

from __future__ import annotations

import errno
import resource
import socket
import ssl

from stallwatch.web.http import HeadBuffer

__all__ = ["connection_cap", "listen", "read_available", "send_quietly"]

_RETRY = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def _somaxconn() -> int:
    try:
        with open("/proc/sys/net/core/somaxconn") as handle:
            return int(handle.read())
    except (OSError, ValueError):
        return 4096


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """`host` "" (or "::") is every address: dual-stack where IPv6 exists, else IPv4 only."""
    backlog = max(1, min(backlog, _somaxconn()))
    if host in ("", "::") and socket.has_ipv6:
        try:
            return _bind(socket.AF_INET6, ("::", port), backlog, dual=True)
        except OSError as exc:
            if host == "::" or exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT):
                raise
    if host in ("", "::"):
        return _bind(socket.AF_INET, ("0.0.0.0", port), backlog)
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return _bind(family, address, backlog)


def _bind(family: int, address: tuple, backlog: int, dual: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if dual:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def connection_cap(wanted: int, reserve: int = 64) -> int:
    """At most `wanted`, and enough descriptors left below RLIMIT_NOFILE for collections (procfs, logs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - reserve, soft * 3 // 4))


def read_available(sock: socket.socket, buffer: HeadBuffer, limit: int) -> bool:
    """What is readable now, without blocking, until over `limit` bytes are unconsumed: a head is complete within
    them or too large, so one read past the head limit is the most a connection holds. False when the peer closed
    or failed."""
    if buffer.pending() <= limit:
        buffer.compact()
    while buffer.pending() <= limit:
        try:
            data = sock.recv(65536)
        except _RETRY:
            return True
        except (ssl.SSLError, OSError):
            return False
        if not data:
            return False
        buffer.buf += data
    return True


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """One non-blocking send of a last answer (a refusal) before the connection is closed; failures ignored."""
    try:
        sock.setblocking(False)
        sock.send(data)
    except (OSError, ssl.SSLError):
        pass
