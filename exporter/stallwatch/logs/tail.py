"""The last lines of a server's log, for the evidence in `stallwatch diagnose` and the status pages.

`LogTail` is the log interpreter's tap: it sees every block of the engine's decoded text. It copies at most
KEEP_BYTES a block and cuts lines only when they are read, so it costs next to nothing on the log's hot path.
"""

from __future__ import annotations

import re
import threading
from collections import deque

from stallwatch.logs.formats import ANSI
from stallwatch.text import printable

TAIL_LINES = 40
MAX_LINE_BYTES = 4096  # of one log line in a report


class LogTail:
    """The last bytes fed to a server's log interpreter, cut into lines when read."""

    KEEP_BYTES = 64 << 10

    def __init__(self) -> None:
        self._data = bytearray()
        self._cut = False  # the front of `_data` is the middle of a line
        self._lock = threading.Lock()

    def __call__(self, block: bytes) -> None:
        with self._lock:
            self._data += block[-self.KEEP_BYTES:]
            if len(self._data) > 2 * self.KEEP_BYTES:
                del self._data[:-self.KEEP_BYTES]
                self._cut = True

    def lines(self, count: int = TAIL_LINES) -> list[str]:
        """The last `count` lines: decoded engine text, progress-bar rewrites (`\\r`) collapsed."""
        with self._lock:
            data, cut = bytes(self._data), self._cut
        lines: deque[str] = deque(maxlen=count)
        open_line = rewrite = False  # a line was begun since the last newline; a `\r` returned to its start
        pieces = re.split(rb"(\r\n|\n|\r)", data)
        for piece in pieces[2:] if cut else pieces:
            if piece in (b"\n", b"\r\n"):
                open_line = rewrite = False
            elif piece == b"\r":
                rewrite = True
            elif piece.strip():
                text = printable(ANSI.sub(b"", piece[:MAX_LINE_BYTES]).decode("utf-8", "surrogateescape"))
                if rewrite and open_line:
                    lines[-1] = text
                else:
                    lines.append(text)
                open_line, rewrite = True, False
        return list(lines)
