"""HTTP/1.1 without sockets: the request head parsed (`parse_head`), the response written (`serialize`), keep-alive
decided (`keep_alive`), and a connection's read buffer with the scan for the next head's end (`HeadBuffer`). Pure:
`web.server` owns the sockets, the loop and the workers.
"""

from __future__ import annotations

import email.utils
import http
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qs, urlsplit

__all__ = ["Handler", "HeadBuffer", "HeadError", "Request", "Response", "keep_alive", "parse_head", "serialize"]

# Control characters but HTAB: invalid in a request line and in fields (RFC 9110 5.5), refused as Go's server does.
# A bare CR kept in a value would reach a response header (prometheus_client echoes the Accept version).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


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


class HeadBuffer:
    """What a connection has read and not yet consumed (`buf[start:]`), and where the next request head ends in it."""

    __slots__ = ("buf", "scanned", "start")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.start = 0  # buf[start:] is not consumed yet: requests are taken by offset, not by moving the rest
        self.scanned = 0  # no head ends before this offset: a search resumes here instead of rescanning

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
        return end if 0 <= end - self.start <= limit else -1

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
    """A request head refused, with the status to answer it with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def parse_head(head: bytes, peer: str = "") -> Request:
    """One request head (without its leading empty lines) as a Request; HeadError for anything malformed."""
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


def keep_alive(request: Request) -> bool:
    """Whether the connection stays open after the response to `request`."""
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    if "close" in tokens or request.version != "HTTP/1.1":
        return False
    # A request body is never read (only GET and HEAD are served): close rather than parse it as a next request.
    no_body = request.headers.get("content-length", "0").strip() in ("", "0")
    return no_body and "transfer-encoding" not in request.headers


def serialize(response: Response, head_only: bool, keep: bool) -> bytes:
    """The response's bytes on the wire (its head alone for HEAD); ValueError for a control character in a header."""
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
