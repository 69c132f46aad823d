"""A bounded HTTP/1.1 server: one event-loop thread that owns every waiting connection, and a fixed worker pool.

Why not `socketserver.ThreadingMixIn`: it spends one thread per connection, with no timeout and no cap, so idle or
slowloris connections hold threads for as long as they like. Here a connection only reaches a worker once its
whole request head has arrived (the loop reads heads with non-blocking reads), so a client that trickles headers
holds a buffer, not a worker, and is cut at its deadline (`header_timeout` from the first byte, not per read, as
Go's `http.Server.ReadHeaderTimeout`). TLS handshakes are stepped in workers with non-blocking sockets: the CPU
work happens there, every wait happens in the loop, so a handshake-less or half-open TLS client stalls nobody.

A worker serves at most `requests_per_turn` pipelined requests of a connection, then the connection queues again
behind the others, so a client that always has another request queued cannot keep a worker. Writes never wait in a
worker either: it sends what the socket takes at once, and the loop sends the rest as the peer reads, under one
`write_timeout` per response, after which the connection is reset (RST: the kernel drops the unsent bytes too). Until
a response is all sent, no next request of its connection is served, so a slow reader holds one response (and a head
buffer), never a worker (docs/research/audit-2026-12-02.md #8: 16 connections that never read held all 8 workers in
blocking sends).

The loop reads at most one read past `max_head_bytes` of unconsumed bytes per connection: a complete head is within
that or it is refused (431) at once, whether more bytes arrive or not, so a connection never buffers more than a head
and one read. Memory held for clients is thus at most `max_connections` x (a head, one read and one response).

Limits: `max_connections` (kept below the process's RLIMIT_NOFILE: `sockets.connection_cap`); when full, the
connection waiting longest with no request is closed to admit the new one, so idle floods cannot lock scrapers out.
At EMFILE/ENFILE the accept loop backs off 5 ms doubling to 1 s like Go's `net/http` `Server.Serve` (never spins),
closing the oldest waiting connection to free a descriptor. The request head and the response are `web.http`'s,
the listening socket `web.sockets`'.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import queue
import selectors
import socket
import ssl
import struct
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from stallwatch.web.http import Handler, HeadBuffer, HeadError, Request, Response, keep_alive, parse_head, serialize
from stallwatch.web.sockets import connection_cap, listen, read_available, send_quietly

log = logging.getLogger(__name__)

_FD_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() discards what is unsent and sends RST


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


class _Conn(HeadBuffer):
    __slots__ = ("close_after", "deadline", "idle", "out", "peer", "sock", "state", "want_write")

    def __init__(self, sock: socket.socket, peer: str, state: str, deadline: float) -> None:
        super().__init__()
        self.sock = sock
        self.peer = peer
        self.state = state  # "handshake" | "head"
        self.deadline = deadline
        self.idle = False  # keep-alive, waiting for a next request: its deadline moves at the first byte
        self.want_write = False
        self.out: memoryview | None = None  # the unsent rest of a response: no next request is served until it is sent
        self.close_after = False  # close once `out` is sent (the response said `Connection: close`)

    def next_head(self, limit: int) -> int:
        """End offset of the next head once the handshake is done, it is complete and at most `limit` bytes; else -1."""
        return super().next_head(limit) if self.state == "head" else -1


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
        if conn.out is not None:  # the socket drained: the loop writes more of the response, never a worker
            self._unwait(conn)
            if self._write(conn):
                self._dispatch(conn)
            else:
                self._close(conn)
            return
        if conn.state == "handshake":
            self._unwait(conn)
            self._tasks.put(conn)
            return
        if not read_available(conn.sock, conn, self.limits.max_head_bytes):
            self._close(conn)
            return
        self._started(conn)
        self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        """After a read or a worker's turn: a complete head goes to a worker, behind the connections already queued
        (pipelined ones too); bytes over the head limit without one are refused at once, since nothing more is read
        for them; else the connection waits (registered once) for more bytes. One with a response still unsent waits
        for its socket to drain instead, under the response's write deadline."""
        if conn.out is not None:
            self._wait(conn)
        elif conn.next_head(self.limits.max_head_bytes) >= 0:
            self._unwait(conn)
            self._tasks.put(conn)
        elif conn.pending() > self.limits.max_head_bytes:
            send_quietly(conn.sock, serialize(Response(431, [("Content-Type", "text/plain")], b"Request header "
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
            if conn.out is not None:  # reset: a FIN would wait behind the unsent bytes, in the kernel, for good
                with contextlib.suppress(OSError):
                    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
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
            if conn.out is not None:
                return True  # the loop sends the rest as the peer reads; its next request waits until then
        # TLS may hold bytes that select() cannot see
        if not read_available(conn.sock, conn, self.limits.max_head_bytes):
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
        return read_available(conn.sock, conn, self.limits.max_head_bytes)

    def _serve(self, conn: _Conn, head: bytes) -> bool:
        try:
            request = parse_head(head, conn.peer)
        except HeadError as exc:
            response = Response(exc.status, [("Content-Type", "text/plain; charset=utf-8")], f"{exc}.\n".encode())
            send_quietly(conn.sock, serialize(response, False, False))
            return False
        keep, head_only = keep_alive(request), request.method == "HEAD"
        try:
            data = serialize(self.handler(request), head_only, keep)
        except Exception as exc:
            self._failed(request, exc)
            keep = False
            data = serialize(Response(500, [("Content-Type", "text/plain; charset=utf-8")], b"Internal error.\n"),
                             head_only, keep)
        conn.out, conn.close_after = memoryview(data), not keep
        conn.deadline = time.monotonic() + self.limits.write_timeout
        return self._write(conn)

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

    def _write(self, conn: _Conn) -> bool:
        """Send what the socket takes now of `conn.out`, never waiting (in a worker right after the response is made,
        then in the loop each time the socket drains). Whether the connection stays open: False when the peer failed
        or the response, now sent, closes it. Unsent bytes stay in `out`, under the deadline `_serve` set."""
        assert conn.out is not None
        try:
            while conn.out:
                conn.out = conn.out[conn.sock.send(conn.out):]
        except (BlockingIOError, ssl.SSLWantWriteError):
            conn.want_write = True
            return True
        except ssl.SSLWantReadError:  # TLS wants the peer's bytes first (a key update): wait to read, then write
            conn.want_write = False
            return True
        except (OSError, ssl.SSLError) as exc:
            log.debug("write to %s failed: %s", conn.peer, exc)
            return False
        conn.out, conn.want_write = None, False
        conn.idle = True
        conn.deadline = time.monotonic() + self.limits.idle_timeout
        return not conn.close_after
