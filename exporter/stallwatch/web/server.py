"""A bounded HTTP/1.1 server: one event-loop thread that owns every waiting connection, and a fixed worker pool.

Why not `socketserver.ThreadingMixIn`: it spends one thread per connection, with no timeout and no cap, so idle or
slowloris connections hold threads for as long as they like. Here a connection only reaches a worker once its
whole request head has arrived (the loop reads heads with non-blocking reads), so a client that trickles headers
holds a buffer, not a worker, and is cut at its deadline (`header_timeout` from the first byte, not per read, as
Go's `http.Server.ReadHeaderTimeout`). TLS handshakes are stepped in workers with non-blocking sockets: the CPU
work happens there, every wait happens in the loop, so a handshake-less or half-open TLS client stalls nobody.

A worker serves at most `requests_per_turn` pipelined requests of a connection, then the connection queues again
behind the others, so a client that always has another request queued cannot keep a worker. The loop reads at most
one read past `max_head_bytes` of unconsumed bytes per connection: a complete head is within that or it is refused
(431) at once, whether more bytes arrive or not, so a connection never buffers more than a head and one read.

Limits: `max_connections` (kept below the process's RLIMIT_NOFILE); when full, the connection waiting longest
with no request is closed to admit the new one, so idle floods cannot lock scrapers out. At EMFILE/ENFILE the
accept loop backs off 5 ms doubling to 1 s like Go's `net/http` `Server.Serve` (never spins), closing the oldest
waiting connection to free a descriptor. Listen backlog 1024 (the kernel caps it at `net.core.somaxconn`).
`:port` is one dual-stack AF_INET6 socket (IPV6_V6ONLY=0) where IPv6 exists, else AF_INET, as Go's `net.Listen`.
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import errno
import http
import logging
import queue
import re
import resource
import selectors
import socket
import ssl
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qs, urlsplit

log = logging.getLogger(__name__)

_FD_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_RETRY = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
# Control characters but HTAB: invalid in a request line and in fields (RFC 9110 5.5), refused as Go's server does.
# A bare CR kept in a value would reach a response header (prometheus_client echoes the Accept version).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True)
class Limits:
    workers: int = 8
    max_connections: int = 4096
    header_timeout: float = 10.0  # from the first byte of a request (or the accept) to its complete head
    idle_timeout: float = 300.0  # keep-alive: longer than any usual scrape interval, so reuse never races a close
    handshake_timeout: float = 10.0
    write_timeout: float = 10.0
    max_head_bytes: int = 16384
    backlog: int = 1024
    requests_per_turn: int = 4  # pipelined requests a worker serves before the connection queues behind the others


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]  # names in lower case
    peer: str = ""
    url: SplitResult = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = urlsplit(self.target)  # ValueError for a target that does not split (`//[`): a 400 in parse_head

    @property
    def path(self) -> str:
        return self.url.path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(self.url.query)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


Handler = Callable[[Request], Response]


class _Conn:
    __slots__ = ("buf", "deadline", "idle", "peer", "scanned", "sock", "start", "state", "want_write")

    def __init__(self, sock: socket.socket, peer: str, state: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.state = state  # "handshake" | "head"
        self.deadline = deadline
        self.buf = bytearray()
        self.start = 0  # buf[start:] is not consumed yet: requests are taken by offset, not by moving the rest
        self.scanned = 0  # no head ends before this offset: a search resumes here instead of rescanning
        self.idle = False  # keep-alive, waiting for a next request: its deadline moves at the first byte
        self.want_write = False

    def pending(self) -> int:
        return len(self.buf) - self.start

    def head_end(self) -> int:
        """Offset just past the blank line ending the next head, or -1 (bare LF lines accepted, RFC 9112 2.2). The
        search starts where the last one gave up (3 bytes back: an ending split across reads) and looks for `\\n\\n`
        only before the first CRLF ending, so each byte is scanned a bounded number of times."""
        begin = max(self.start, self.scanned - 3)
        crlf = self.buf.find(b"\r\n\r\n", begin)
        lf = self.buf.find(b"\n\n", begin, crlf + 4 if crlf >= 0 else len(self.buf))
        ends = [i + 4 for i in (crlf,) if i >= 0] + [i + 2 for i in (lf,) if i >= 0]
        if not ends:
            self.scanned = len(self.buf)
            return -1
        return min(ends)

    def next_head(self, limit: int) -> int:
        """End offset of the next head if it is complete and at most `limit` bytes, else -1."""
        end = self.head_end()
        return end if self.state == "head" and 0 <= end - self.start <= limit else -1

    def take_head(self, limit: int) -> bytes | None:
        """The next complete head of at most `limit` bytes, consumed, without its leading empty lines; or None."""
        end = self.next_head(limit)
        if end < 0:
            return None
        head = bytes(self.buf[self.start:end])
        self.start = self.scanned = end
        return head.lstrip(b"\r\n")

    def compact(self) -> None:
        """Drop the consumed bytes: once per read (at most a head's worth moves), not once per request."""
        if self.start:
            del self.buf[:self.start]
            self.scanned -= self.start
            self.start = 0


class HeadError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def parse_head(head: bytes, peer: str = "") -> Request:
    lines = [line.removesuffix("\r") for line in head.decode("latin-1").split("\n")]
    if any(_CONTROL.search(line) for line in lines):
        raise HeadError(400, "control character in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise HeadError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HeadError(505, "unsupported HTTP version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or line[:1] in (" ", "\t"):
            raise HeadError(400, "malformed header line")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if version == "HTTP/1.1" and "host" not in headers:  # RFC 9112 3.2, as Go's server
        raise HeadError(400, "missing Host header")
    try:
        return Request(method, target, version, headers, peer)
    except ValueError:
        raise HeadError(400, "malformed request target") from None


def _keep_alive(request: Request) -> bool:
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    if "close" in tokens or request.version != "HTTP/1.1":
        return False
    # A request body is never read (only GET and HEAD are served): close rather than parse it as a next request.
    no_body = request.headers.get("content-length", "0").strip() in ("", "0")
    return no_body and "transfer-encoding" not in request.headers


def serialize(response: Response, head_only: bool, keep: bool) -> bytes:
    phrase = http.HTTPStatus(response.status).phrase
    lines = [f"HTTP/1.1 {response.status} {phrase}", f"Date: {email.utils.formatdate(usegmt=True)}",
             f"Content-Length: {len(response.body)}"]
    lines += [f"{name}: {value}" for name, value in response.headers]
    if any(_CONTROL.search(line) for line in lines):  # a line break in a value would start a header of its own
        raise ValueError(f"control character in a response header: {lines!r}")
    if not keep:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    return head if head_only else head + response.body


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


class HttpServer:
    def __init__(self, handler: Handler, host: str, port: int, limits: Limits | None = None,
                 tls: Callable[[], ssl.SSLContext] | None = None) -> None:
        limits = limits or Limits()
        self.handler = handler
        self.limits = limits
        self.tls = tls
        self.max_connections = connection_cap(limits.max_connections)
        self.socket = listen(host, port, limits.backlog)
        self.server_port: int = self.socket.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._returned: collections.deque[tuple[_Conn, bool]] = collections.deque()
        self._tasks: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._waiting: dict[int, _Conn] = {}  # by fd, in the order they started waiting (oldest first)
        self._open = 0
        self._stop = threading.Event()
        self._accept_delay = 0.0
        self._accept_resume = 0.0
        self._out_of_fds = False
        self._threads: list[threading.Thread] = []
        self._failures: set[tuple[type, str, int]] = set()  # kinds of handler errors logged with a traceback
        self._failures_lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> threading.Thread:
        self._selector.register(self.socket, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        loop = threading.Thread(target=self._loop, name="http", daemon=True)
        self._threads = [loop] + [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                                  for i in range(self.limits.workers)]
        for thread in self._threads:
            thread.start()
        return loop

    def shutdown(self) -> None:
        self._stop.set()
        self._wake()
        for _ in range(self.limits.workers):
            self._tasks.put(None)
        for thread in self._threads:
            thread.join(5)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the loop
            self._wake_w.send(b"x")

    @property
    def open_connections(self) -> int:
        return self._open

    # -- the loop: accepts, reads heads, enforces deadlines ---------------------------------------------------

    def _loop(self) -> None:
        next_sweep = 0.0
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(0.25):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._ready(key.data)
                now = time.monotonic()
                if self._accept_resume and now >= self._accept_resume:
                    self._accept_resume = 0.0
                    self._selector.register(self.socket, selectors.EVENT_READ, "listen")
                if now >= next_sweep:
                    self._expire(now)
                    next_sweep = now + 0.25
        finally:
            for conn in list(self._waiting.values()):
                self._close(conn)
            self._selector.close()
            self.socket.close()

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then back to serving the others
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                self._accept_delay, self._out_of_fds = 0.0, False
                return
            except OSError as exc:
                if exc.errno in _FD_ERRORS:
                    self._pause_accept(exc)
                    return
                log.debug("accept: %s", exc)  # ECONNABORTED and the like: that client is gone, go on
                continue
            self._accept_delay = 0.0  # Go's Serve resets its delay after each successful accept
            self._admit(sock, address)

    def _pause_accept(self, exc: OSError) -> None:
        """Out of descriptors: the listening socket stays readable, so accepting again at once would spin. Wait
        (5 ms doubling to 1 s), and close the connections waiting longest so that a scrape and a collection (which
        opens procfs files) find descriptors again."""
        if not self._out_of_fds:
            log.warning("accept: %s; backing off, closing the longest-waiting connections", exc.strerror)
            self._out_of_fds = True
        self._accept_delay = min(1.0, max(0.005, self._accept_delay * 2))
        self._accept_resume = time.monotonic() + self._accept_delay
        self._selector.unregister(self.socket)
        for _ in range(4):
            if not self._evict_oldest():
                break

    def _admit(self, sock: socket.socket, address: tuple) -> None:
        if self._open >= self.max_connections and not self._evict_oldest():
            sock.close()
            return
        sock.setblocking(False)
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = time.monotonic()
        tls = self.tls is not None
        conn = _Conn(sock, str(address[0]), "handshake" if tls else "head",
                     now + (self.limits.handshake_timeout if tls else self.limits.header_timeout))
        self._open += 1
        self._wait(conn)

    def _evict_oldest(self) -> bool:
        for conn in self._waiting.values():
            self._close(conn)
            return True
        return False

    def _wait(self, conn: _Conn) -> None:
        event = selectors.EVENT_WRITE if conn.want_write else selectors.EVENT_READ
        try:
            self._selector.register(conn.sock, event, conn)
        except (ValueError, OSError):
            self._close(conn)
            return
        self._waiting[conn.sock.fileno()] = conn

    def _unwait(self, conn: _Conn) -> None:
        self._waiting.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)

    def _close(self, conn: _Conn) -> None:
        self._unwait(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._open -= 1

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        while self._returned:
            conn, keep = self._returned.popleft()
            if keep:
                self._dispatch(conn)
            else:
                self._close_returned(conn)  # a worker had it: it is in no selector

    def _close_returned(self, conn: _Conn) -> None:
        with contextlib.suppress(OSError):
            conn.sock.close()
        self._open -= 1

    def _ready(self, conn: _Conn) -> None:
        if conn.state == "handshake":
            self._unwait(conn)
            self._tasks.put(conn)
            return
        if not read_available(conn, self.limits.max_head_bytes):
            self._close(conn)
            return
        self._started(conn)
        self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        """After a read or a worker's turn: a complete head goes to a worker, behind the connections already queued
        (pipelined ones too); bytes over the head limit without one are refused at once, since nothing more is read
        for them; else the connection waits (registered once) for more bytes."""
        if conn.next_head(self.limits.max_head_bytes) >= 0:
            self._unwait(conn)
            self._tasks.put(conn)
        elif conn.pending() > self.limits.max_head_bytes:
            _send_quietly(conn.sock, serialize(Response(431, [("Content-Type", "text/plain")], b"Request header "
                                                     b"fields too large.\n"), False, False))
            self._close(conn)
        elif conn.sock.fileno() not in self._waiting:
            self._wait(conn)

    def _started(self, conn: _Conn) -> None:
        """A keep-alive connection with bytes of a next request: from now on its head has `header_timeout`, so
        a request followed by a trickled partial one cannot stretch the head deadline to the idle timeout."""
        if conn.idle and conn.pending():
            conn.idle = False
            conn.deadline = time.monotonic() + self.limits.header_timeout

    def _expire(self, now: float) -> None:
        expired = [conn for conn in self._waiting.values() if conn.deadline <= now]
        for conn in expired:
            self._close(conn)

    # -- workers: TLS handshakes and requests -----------------------------------------------------------------

    def _work(self) -> None:
        while True:
            conn = self._tasks.get()
            if conn is None:
                return
            try:
                keep = self._step(conn)
            except Exception:
                log.exception("HTTP connection from %s failed", conn.peer)
                keep = False
            self._returned.append((conn, keep))
            self._wake()

    def _step(self, conn: _Conn) -> bool:
        """One turn: the handshake's next step, or up to `requests_per_turn` requests; the loop queues it again."""
        if conn.state == "handshake" and not self._handshake(conn):
            return False
        if conn.state != "head":
            return True  # the handshake waits for the peer: nothing to read as a request yet
        for _ in range(self.limits.requests_per_turn):
            head = conn.take_head(self.limits.max_head_bytes)
            if head is None:
                break
            if head and not self._serve(conn, head):
                return False
        if not read_available(conn, self.limits.max_head_bytes):  # TLS may hold bytes that select() cannot see
            return False
        self._started(conn)
        return True

    def _handshake(self, conn: _Conn) -> bool:
        """One step of a non-blocking handshake; waiting for the peer goes back to the loop, under its deadline."""
        assert self.tls is not None
        if not isinstance(conn.sock, ssl.SSLSocket):
            conn.sock = self.tls().wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            conn.want_write = False
            return True
        except ssl.SSLWantWriteError:
            conn.want_write = True
            return True
        except (ssl.SSLError, OSError) as exc:
            log.debug("TLS handshake with %s failed: %s", conn.peer, exc)
            return False
        conn.want_write = False
        conn.state = "head"
        conn.deadline = time.monotonic() + self.limits.header_timeout
        return read_available(conn, self.limits.max_head_bytes)

    def _serve(self, conn: _Conn, head: bytes) -> bool:
        try:
            request = parse_head(head, conn.peer)
        except HeadError as exc:
            response = Response(exc.status, [("Content-Type", "text/plain; charset=utf-8")], f"{exc}.\n".encode())
            _send_quietly(conn.sock, serialize(response, False, False))
            return False
        keep, head_only = _keep_alive(request), request.method == "HEAD"
        try:
            data = serialize(self.handler(request), head_only, keep)
        except Exception as exc:
            self._failed(request, exc)
            keep = False
            data = serialize(Response(500, [("Content-Type", "text/plain; charset=utf-8")], b"Internal error.\n"),
                             head_only, keep)
        if not self._send(conn, data):
            return False
        conn.idle = True
        conn.deadline = time.monotonic() + self.limits.idle_timeout
        return keep

    def _failed(self, request: Request, exc: Exception) -> None:
        """Logged with its traceback once per kind (type and where it was raised), later ones at debug: a client
        that repeats a failing request must not fill the log."""
        *_, (frame, line) = traceback.walk_tb(exc.__traceback__)
        kind = (type(exc), frame.f_code.co_filename, line)
        with self._failures_lock:
            first = kind not in self._failures
            self._failures.add(kind)
        if first:
            log.error("handler failed for %s %r (logged once per kind of error)", request.method, request.target,
                      exc_info=exc)
        else:
            log.debug("handler failed for %s %r: %r", request.method, request.target, exc)

    def _send(self, conn: _Conn, data: bytes) -> bool:
        try:
            conn.sock.settimeout(self.limits.write_timeout)
            conn.sock.sendall(data)
            conn.sock.setblocking(False)
        except (OSError, ssl.SSLError) as exc:
            log.debug("write to %s failed: %s", conn.peer, exc)
            return False
        return True


def read_available(conn: _Conn, limit: int) -> bool:
    """What is readable now, without blocking, until over `limit` bytes are unconsumed: a head is complete within
    them or too large, so one read past the head limit is the most a connection holds. False when the peer closed
    or failed."""
    if conn.pending() <= limit:
        conn.compact()
    while conn.pending() <= limit:
        try:
            data = conn.sock.recv(65536)
        except _RETRY:
            return True
        except (ssl.SSLError, OSError):
            return False
        if not data:
            return False
        conn.buf += data
    return True


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.setblocking(False)
        sock.send(data)
    except (OSError, ssl.SSLError):
        pass
