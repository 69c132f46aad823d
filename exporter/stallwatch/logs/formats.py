"""Incremental decoders from a container runtime's log-file framing back to the engine's own output.

Inside a container the engine's stdout/stderr do not reach a file as written: the runtime frames every line.
Kubernetes runtimes write the CRI format (containerd, CRI-O), Docker's default driver writes one JSON object per
line. The phase detector wants the engine's text, so the follower passes each chunk it reads through a `Decoder`.

Contract shared by all decoders:
- `decode(data)` accepts any chunking of the file's bytes and returns engine bytes; concatenating the outputs gives
  the engine's original output, stdout and stderr each in order. Records are only emitted whole (a decoder keeps the
  unfinished tail of the input and the partial pieces of a split line until they complete).
- Input is untrusted: nothing raises. Records that do not parse are counted in `errors`; bytes dropped to keep
  memory bounded (a record or a joined line over 1 MiB keeps its start) are counted in `dropped_bytes`.
- `reset()` is called when the file was truncated or replaced: the kept tail and pieces belong to the old file.

Speed: the common chunk (only complete records, well formed) is decoded with a handful of C-level operations
(one regex split, one join), never a Python loop over lines; the slow, per-line path runs only for chunks that
hold partial records, garbled lines or escapes that the bulk path cannot prove correct.

Before its framing is decoded, a file's bytes pass through a `Transcoder`: a UTF-16 file (a byte-order mark at its
top, as PowerShell's redirect writes it) becomes UTF-8, any other passes as it is.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from typing import Protocol

from stallwatch.text import utf8_bytes

# Terminal colour codes are framing too, not the engine's text: stripped before lines are matched or shown.
ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]")
MAX_RECORD_BYTES = 1 << 20  # kept of one raw record (an input line) that has not ended yet
MAX_PENDING_BYTES = 1 << 20  # kept of one stream's joined partial pieces


class Decoder(Protocol):
    """Turns a runtime-framed log byte stream into the engine's own output bytes."""

    errors: int
    dropped_bytes: int

    def decode(self, data: bytes) -> bytes: ...

    def reset(self) -> None: ...


class PlainDecoder:
    """Identity: the file holds the engine's output as written (`StandardOutput=file:`, a redirect, `fd/1`)."""

    def __init__(self) -> None:
        self.errors = 0
        self.dropped_bytes = 0

    def decode(self, data: bytes) -> bytes:
        return bytes(data)

    def reset(self) -> None:
        """Nothing is kept between calls."""


class _LineFramed:
    """Shared part of line-framed formats: keeps the unfinished last record, bounded, and hands on complete ones.

    Subclasses decode complete records into "parts": a list whose `b"\\n".join` is the output and whose last
    element is `b""` (so the output ends with a newline), which lets two results be spliced without a copy.
    """

    def __init__(self) -> None:
        self.errors = 0
        self.dropped_bytes = 0
        self._rest = bytearray()  # the input after the last newline seen: an unfinished record
        self._skipping = False  # the unfinished record outgrew MAX_RECORD_BYTES: drop input until its newline
        self._pending: dict[bytes, bytearray] = {}  # stream → joined partial pieces

    def reset(self) -> None:
        """Forget the unfinished record and all pending pieces: they belong to the file that went away."""
        self._rest = bytearray()
        self._skipping = False
        self._pending = {}

    def decode(self, data: bytes) -> bytes:
        """Decode every record completed by `data`; keep the unfinished tail for the next call."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                self.dropped_bytes += len(data)
                return b""
            self.dropped_bytes += newline
            data = data[newline:]  # the newline ends the truncated record that was kept
            self._skipping = False
        last = data.rfind(b"\n")
        if last < 0:
            self._keep(data)
            return b""
        parts: list[bytes] = []
        start = 0
        if self._rest:  # finish the record begun in an earlier call on its own, so `data` is never copied
            start = data.find(b"\n") + 1
            record = bytes(self._rest) + data[:start]
            self._rest = bytearray()
            parts = self._records(record, 0, len(record))[:-1]
        if start <= last:
            parts += self._records(data, start, last + 1)
        else:
            parts.append(b"")
        self._keep(data[last + 1 :])
        return b"\n".join(parts)

    def _keep(self, tail: bytes) -> None:
        room = MAX_RECORD_BYTES - len(self._rest)
        if len(tail) > room:
            self._rest += tail[:room]
            self.dropped_bytes += len(tail) - room
            self._skipping = True
        else:
            self._rest += tail

    def _records(self, data: bytes, start: int, end: int) -> list[bytes]:
        """Decode `data[start:end]`, whole records ending with a newline, into parts (see the class)."""
        raise NotImplementedError

    def _partial(self, stream: bytes, content: bytes) -> None:
        """Keep a piece of a split line until its stream's final piece arrives; bounded, the start kept."""
        pending = self._pending.setdefault(stream, bytearray())
        room = max(MAX_PENDING_BYTES - len(pending), 0)
        if len(content) > room:
            pending += content[:room]
            self.dropped_bytes += len(content) - room
        else:
            pending += content

    def _final(self, stream: bytes, content: bytes, out: list[bytes]) -> None:
        """Emit a stream's line (without its newline): its pending pieces, then `content`, which ends it."""
        pending = self._pending.pop(stream, None)
        out.append(bytes(pending) + content if pending else content)


# CRI: `<timestamp> <stdout|stderr> <P|F>[:tags] <content>\n` (cri-api pkg/apis/runtime/v1/constants.go; written
# by containerd internal/cri/io/logger.go and containers/conmon src/ctr_logging.c; read by kubelet parseCRILog in
# kubernetes/kubernetes pkg/kubelet/kuberuntime/logs/logs.go). The timestamp is RFC3339Nano with `Z` (containerd)
# or a fixed-width `±hh:mm` offset (CRI-O); it is not checked beyond "a token without spaces".
# The bulk patterns accept a subset of `_CRI_RECORD` (`\S` is faster in `re` than `[^ \n]`); lines they miss go
# through `_CRI_RECORD` one by one, so the result does not depend on the path.
_CRI_NEXT_FULL = re.compile(rb"\n\S+ std(?:out|err) F ")  # begins every plain full record but the first
_CRI_FULL = re.compile(rb"\S+ std(?:out|err) F ")
_CRI_NEXT = re.compile(rb"\n\S+ (std(?:out|err)) ([PF]) ")  # the same for full and partial records
_CRI_FIRST = re.compile(rb"\S+ (std(?:out|err)) ([PF]) ")
_CRI_RECORD = re.compile(rb"([^ ]+) (stdout|stderr) ([^ ]*)(?: (.*))?", re.S)  # any record, tags included


class CriDecoder(_LineFramed):
    """CRI log files (`/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log`).

    `F` content is a line (a newline is appended); `P` content is a piece of one: containerd cuts lines at
    `max_container_log_line_size` (16 KiB default), CRI-O at its 8 KiB read boundaries. Pieces are joined per
    stream, so a stderr line written between two stdout pieces is emitted whole and on its own. A line that is not
    a CRI record passes through as it is, newline added, and counts in `errors`.
    """

    def __init__(self) -> None:
        super().__init__()
        self._partials_seen = False  # the last chunk held P records: expect more (CRI-O cuts at every 8 KiB read)

    def reset(self) -> None:
        super().reset()
        self._partials_seen = False

    def _records(self, data: bytes, start: int, end: int) -> list[bytes]:
        view = memoryview(data)[start:end]
        lines = data.count(b"\n", start, end)
        if not self._partials_seen and not self._pending:
            pieces = _CRI_NEXT_FULL.split(view)  # [first line, content, content, ...]
            first = _CRI_FULL.match(pieces[0]) if len(pieces) == lines else None
            if first is not None:  # every line is a full record (else a piece holds a newline)
                pieces[0] = pieces[0][first.end() :]
                pieces[-1] = pieces[-1][:-1]
                pieces.append(b"")
                return pieces
        pieces = _CRI_NEXT.split(view)  # [first line, stream, tag, content, stream, tag, content, ...]
        first = _CRI_FIRST.match(pieces[0]) if len(pieces) == 3 * lines - 2 else None
        if first is None:
            return self._slow(pieces)
        streams, tags, contents = pieces[1::3], pieces[2::3], pieces[3::3]
        streams.insert(0, first.group(1))
        tags.insert(0, first.group(2))
        contents.insert(0, pieces[0][first.end() :])
        contents[-1] = contents[-1][:-1]
        return self._join(streams, tags, contents)

    def _join(self, streams: list[bytes], tags: list[bytes], contents: list[bytes]) -> list[bytes]:
        """Well-formed records, some partial: C-level list searches find the P records and their stream's next
        record, so Python works per P record, not per line."""
        partials = b"P" in tags
        if len(tags) > 1:  # not just the record finished from the previous read
            self._partials_seen = partials
        for stream in list(self._pending):  # pieces from earlier chunks go before the stream's first F here
            self._prepend(stream, streams, tags, contents, 0)
        out: list[bytes] = []
        done = 0
        partial = -1
        while partials:
            try:
                partial = tags.index(b"P", partial + 1)
            except ValueError:
                break
            out += contents[done:partial]
            done = partial + 1
            self._partial(streams[partial], contents[partial])
            self._prepend(streams[partial], streams, tags, contents, partial + 1)
        out += contents[done:]
        out.append(b"")
        return out

    def _prepend(self, stream: bytes, streams: list[bytes], tags: list[bytes], contents: list[bytes], at: int) -> None:
        """Put `stream`'s pending pieces before its next record from `at` on, if that one is full."""
        try:
            following = streams.index(stream, at)
        except ValueError:
            return  # the line goes on in a later chunk
        if tags[following] == b"F":
            contents[following] = bytes(self._pending.pop(stream)) + contents[following]

    def _slow(self, pieces: list[bytes]) -> list[bytes]:
        """Per-record path for chunks with lines that are not plain records: garbled, tagged, or without content."""
        pieces[-1] = pieces[-1][:-1]  # the newline that ends the chunk
        out: list[bytes] = []
        for line in pieces[0].split(b"\n"):
            self._line(line, out)
        for i in range(1, len(pieces), 3):
            content, newline, unmatched = pieces[i + 2].partition(b"\n")
            if pieces[i + 1] == b"P":
                self._partial(pieces[i], content)
            else:
                self._final(pieces[i], content, out)
            if newline:
                for line in unmatched.split(b"\n"):
                    self._line(line, out)
        out.append(b"")
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        record = _CRI_RECORD.fullmatch(line)
        tag = record.group(3).partition(b":")[0] if record else b""
        if record is None or tag not in (b"P", b"F"):
            self.errors += 1
            out.append(line)
        elif tag == b"P":
            self._partial(record.group(2), record.group(4) or b"")
        else:
            self._final(record.group(2), record.group(4) or b"", out)
        self._partials_seen = self._partials_seen or tag == b"P"


# Docker json-file: `{"log":"…","stream":"stdout|stderr","attrs":{…}?,"time":"…"}` one per line, keys in this
# order (moby/moby daemon/logger/jsonfilelog/jsonlog/jsonlogbytes.go); `log` ends in `\n` unless the line was cut
# at the copier's 16 KiB buffer (daemon/logger/copier.go, daemon/logger/jsonfilelog/jsonfilelog.go).
# The bulk patterns accept only unescaped attrs and plain times, a subset of what `json.loads` takes line by line.
_DOCKER_STRING = rb'"[^"\\\n]*"'
_DOCKER_PAIR = _DOCKER_STRING + b":" + _DOCKER_STRING
_DOCKER_ATTRS = rb'"attrs":\{(?:' + _DOCKER_PAIR + rb"(?:," + _DOCKER_PAIR + rb")*)?\},"
_DOCKER_TAIL = rb'\\n","stream":"std(?:out|err)",(?:"time"|' + _DOCKER_ATTRS + rb'"time"):"[\w:.+-]*"\}\n'
_DOCKER_SEPARATOR = re.compile(_DOCKER_TAIL + rb'\{"log":"')  # from one record's final `\n"` to the next's body
_DOCKER_LAST = re.compile(rb"(.*)" + _DOCKER_TAIL, re.S)
_DOCKER_HEAD = b'{"log":"'
_DOCKER_STREAMS = ("stdout", "stderr")  # all that dockerd writes



class DockerJsonDecoder(_LineFramed):
    """Docker's json-file driver (`/var/lib/docker/containers/<id>/<id>-json.log`).

    Records whose `log` lacks the final newline are pieces of one long line: they are joined per stream until one
    ends with a newline. Invalid JSON, a non-object, a missing or non-string `log`, or a `stream` other than Docker's
    two (each would keep its own pieces) skips the record and counts in `errors`. Bytes that are not UTF-8 (Docker
    writes none) pass through unchanged.
    """

    def _records(self, data: bytes, start: int, end: int) -> list[bytes]:
        if not self._pending:
            bodies = self._bodies(data, start, end)
            if bodies is not None:
                return bodies
        out: list[bytes] = []
        for line in data[start : end - 1].split(b"\n"):
            self._line(line, out)
        out.append(b"")
        return out

    def _bodies(self, data: bytes, start: int, end: int) -> list[bytes] | None:
        """Bulk path for complete records in Docker's own key order; None when some record needs the slow path."""
        lines = data.count(b"\n", start, end)
        pieces = _DOCKER_SEPARATOR.split(memoryview(data)[start:end])
        if len(pieces) != lines or not pieces[0].startswith(_DOCKER_HEAD):
            return None
        last = _DOCKER_LAST.fullmatch(pieces[-1], len(_DOCKER_HEAD) if lines == 1 else 0)
        if last is None:
            return None
        if lines > 1:
            pieces[0] = pieces[0][len(_DOCKER_HEAD) :]
        pieces[-1] = last.group(1)
        text = b"\n".join(pieces)
        if b"\\" not in text and b'"' not in text:  # no escapes: the bodies are the text
            return [text, b""]
        # One JSON string holding every body: the C scanner unescapes the whole chunk at once. A body cut after an
        # escaped backslash (`"a\\n"` is a piece, not a line) ends in `\`, which the joining newline makes an
        # invalid escape, so such a chunk fails here and goes the per-line way.
        try:
            decoded = json.loads('"' + text.decode("utf-8", "surrogateescape") + '"', strict=False)
        except ValueError:  # a raw quote or a bad escape: some record is not valid JSON
            return None
        return [utf8_bytes(decoded), b""]

    def _line(self, line: bytes, out: list[bytes]) -> None:
        try:
            record = json.loads(line.decode("utf-8", "surrogateescape"), strict=False)
        except (ValueError, RecursionError):
            record = None
        text = record.get("log") if isinstance(record, dict) else None
        stream = record.get("stream") if isinstance(record, dict) else None
        if not isinstance(text, str) or stream not in _DOCKER_STREAMS:
            self.errors += 1
            return
        key, content = stream.encode(), utf8_bytes(text)
        if content.endswith(b"\n"):
            self._final(key, content[:-1], out)
        else:
            self._partial(key, content)


# A log's character encoding, before its framing: PowerShell's `>` and `Out-File` (Windows, WSL) write UTF-16 with a
# byte-order mark, every ASCII character followed (LE) or preceded (BE) by a NUL that no rule expects.
_BOMS = {b"\xff\xfe": "utf-16-le", b"\xfe\xff": "utf-16-be"}


class Transcoder:
    """A log file's bytes as UTF-8: UTF-16 (a BOM at offset 0) transcoded, any other file passed on as it is.

    The file's first two bytes decide, anew after `reset` (a rotated or truncated file): as the stream begins when
    it is read from the top, or `begin(head, offset)` when reading starts further on (a restarted exporter's
    replay), which also steps over half a code unit at an odd offset. A code unit or surrogate pair split between
    two reads waits for the next (at most 3 bytes kept); invalid UTF-16 becomes U+FFFD, nothing raises."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.codec: str | None = None  # the file's UTF-16 codec, once its first bytes showed a BOM
        self._decided = False
        self._head = b""  # a lone first byte that may begin a BOM, until the second comes
        self._skip = 0  # bytes still to step over: the BOM, or half a code unit
        self._decoder: codecs.IncrementalDecoder | None = None

    def begin(self, head: bytes, offset: int) -> None:
        """Reading starts at `offset` of a file whose first bytes are `head` (at least two, if it has them)."""
        if offset:
            self._decide(head[:2])
            self._skip = offset % 2

    def _decide(self, head: bytes) -> None:
        self.codec = _BOMS.get(head)
        self._decoder = codecs.getincrementaldecoder(self.codec)("replace") if self.codec else None
        self._decided = True
        self._skip = 2 if self.codec else 0

    def decode(self, data: bytes) -> bytes:
        if not self._decided:
            data = self._head + data
            if len(data) < 2 and any(bom.startswith(data) for bom in _BOMS):
                self._head = data
                return b""
            self._head = b""
            self._decide(data[:2])
        if self._decoder is None:
            return data
        if self._skip:
            data, self._skip = data[self._skip :], max(self._skip - len(data), 0)
        return self._decoder.decode(data).encode("utf-8")


_DECODERS: dict[str, Callable[[], Decoder]] = {
    "plain": PlainDecoder,
    "cri": CriDecoder,
    "docker": DockerJsonDecoder,
}


def decoder_for(fmt: str) -> Decoder:
    """A fresh decoder for `fmt` ("plain", "cri" or "docker"); ValueError for any other name (a config error)."""
    try:
        return _DECODERS[fmt]()
    except KeyError:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(_DECODERS)}") from None
