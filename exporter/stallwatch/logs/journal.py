"""Follow one systemd unit's journal entries through a `journalctl` subprocess.

A server started by a systemd unit writes its stdout/stderr to the journal (StandardOutput=journal is the default,
systemd.exec(5)), so there is no file to follow. Reading the journal through `journalctl --output=json` needs no
build dependency (libsystemd bindings need a compiler or an ABI-sensitive wheel); Vector does the same
(vectordotdev/vector `src/sources/journald.rs`). The match is `_SYSTEMD_UNIT=<unit>`, never `_PID`: output of
forked workers carries the credentials of the process that opened the stream (systemd.journal-fields(7)), and
SGLang and vLLM fork their schedulers.

`read()` never blocks: the pipes are non-blocking and one call reads at most `READ_BUDGET_BYTES`. A journalctl
that exits (killed, journal unreadable, binary missing) makes the reader `up == False` with the reason; the next
`read()` after a backoff (1 s, doubling, at most 60 s) starts a new one with `--after-cursor=<last __CURSOR>`, so
no entry is returned twice and none is lost. Not thread-safe: call it from one thread.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import time
from collections.abc import Callable
from types import TracebackType

from stallwatch.text import utf8_bytes

READ_BUDGET_BYTES = 16 << 20  # of journalctl output consumed per read() call
MAX_LINE_BYTES = 8 << 20  # of one unfinished output line kept; a longer entry is skipped (48K LineMax makes 200 KB)
STDERR_BUDGET_BYTES = 1 << 20  # of journalctl's stderr drained per read() call; only its last line is kept
STDERR_LINE_BYTES = 4096
BACKOFF_MIN_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
STABLE_SECONDS = 60.0  # a journalctl that ran this long resets the backoff
_FIELD_MATCH = re.compile(r"[A-Z0-9_]+=")  # journal field names: upper case, digits, "_" (systemd.journal-fields(7))


class JournalReader:
    """Entries of one unit since a point in time, as `(entry time in seconds, MESSAGE bytes + b"\\n")`."""

    def __init__(
        self,
        unit: str,
        since: float,
        journalctl: str = "journalctl",
        directory: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`unit`: a unit name (`sglang.service`), matched as `_SYSTEMD_UNIT=<unit>`, or a whole journal match
        `FIELD=value` (`CONTAINER_ID_FULL=<id>` for Docker's journald driver; unit names cannot hold `=`).
        `since`: Unix time of the server's launch. `directory`: a journal directory (`--directory`), e.g. the
        host's /var/log/journal mounted into the exporter's container. `clock` drives the restart backoff."""
        self._match = unit if _FIELD_MATCH.match(unit) else f"_SYSTEMD_UNIT={unit}"
        self._since = since if math.isfinite(since) and since > 0 else 0.0
        self._journalctl = journalctl
        self._directory = directory
        self._clock = clock
        self._proc: subprocess.Popen[bytes] | None = None
        self._cursor: str | None = None
        self._last_us: int | None = None  # __REALTIME_TIMESTAMP of the last entry seen
        self._skip_until_us: int | None = None  # after falling back from a cursor to --since: drop what was seen
        self._line = bytearray()  # unfinished output line
        self._skipping = False  # that line outgrew MAX_LINE_BYTES: drop output until its end
        self._stderr = bytearray()  # tail of journalctl's stderr
        self._error: str | None = None
        self._closed = False
        self._backoff = BACKOFF_MIN_SECONDS
        self._next_start = 0.0
        self._started_at = 0.0
        self.skipped = 0  # output lines that were not journal entries with a MESSAGE: counted, not returned
        self._start()

    @property
    def up(self) -> bool:
        """True while a journalctl process runs."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def error(self) -> str | None:
        """Why the reader is down; while up, the last line journalctl wrote to stderr (a warning), if any."""
        if self._proc is None:
            return self._error
        status = self._proc.poll()
        return self._stderr_line() if status is None else self._exit_reason(status)

    @property
    def pid(self) -> int | None:
        """The running journalctl's pid (diagnostics)."""
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """The journalctl command line the next start uses."""
        cmd = [self._journalctl, "--follow", "--all", "--output=json", "--no-pager"]
        if self._directory is not None:
            cmd.append(f"--directory={self._directory}")
        if self._cursor is not None:  # journalctl refuses --since together with --after-cursor
            cmd.append(f"--after-cursor={self._cursor}")
        else:
            cmd.append(f"--since=@{int(self._since)}")
        cmd.append(self._match)
        return cmd

    def read(self) -> list[tuple[float, bytes]]:
        """The entries available now, in journal order; starts journalctl again when it is due."""
        entries: list[tuple[float, bytes]] = []
        if self._proc is None:
            if self._closed or self._clock() < self._next_start:
                return entries
            self._start()
            if self._proc is None:
                return entries
        ended = self._pump_stdout(entries)
        self._pump_stderr()
        if ended:
            self._reap()
        return entries

    def close(self) -> None:
        """Kill and reap journalctl; later reads return nothing."""
        self._closed = True
        if self._proc is not None:
            self._stop()
        self._error = "closed"

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # process ---------------------------------------------------------------------------------------------------

    def _start(self) -> None:
        self._started_at = self._clock()
        self._line = bytearray()
        self._skipping = False
        self._stderr = bytearray()
        try:
            proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                close_fds=True,
            )
        except (OSError, ValueError) as e:  # missing, not executable, or a NUL in the unit name
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self._down(f"cannot run {self._journalctl}: {reason}")
            return
        assert proc.stdout is not None and proc.stderr is not None
        os.set_blocking(proc.stdout.fileno(), False)
        os.set_blocking(proc.stderr.fileno(), False)
        self._proc = proc
        self._error = None

    def _reap(self) -> None:
        """journalctl closed its output: collect its status and last words, and plan the restart."""
        assert self._proc is not None
        self._pump_stderr()
        status = self._stop(grace=0.2)  # it closed its output while exiting: let it finish, for the status
        self._down(self._exit_reason(status))
        last = self._stderr_line()
        if last is not None and "cursor" in last.lower() and self._cursor is not None:
            # The cursor no longer seeks (journal vacuumed or rewritten): go on from the last entry's time instead.
            self._cursor = None
            if self._last_us is not None:
                self._since = self._last_us / 1e6
                self._skip_until_us = self._last_us

    def _exit_reason(self, status: int) -> str:
        last = self._stderr_line()
        how = f"exited with status {status}" if status >= 0 else f"was killed by signal {-status}"
        return f"{self._journalctl} {how}" + (f": {last}" if last else "")

    def _stop(self, grace: float = 0.0) -> int:
        """Kill (after `grace` seconds) and reap journalctl, close its pipes; its exit status."""
        proc, self._proc = self._proc, None
        assert proc is not None
        try:
            status = proc.wait(grace) if grace else proc.poll()
        except subprocess.TimeoutExpired:
            status = None
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            status = proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return status

    def _down(self, reason: str) -> None:
        self._error = reason
        now = self._clock()
        if now - self._started_at >= STABLE_SECONDS:
            self._backoff = BACKOFF_MIN_SECONDS
        self._next_start = now + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_SECONDS)

    # pipes -----------------------------------------------------------------------------------------------------

    def _pump_stdout(self, entries: list[tuple[float, bytes]]) -> bool:
        """Consume the output available now, within the budget; True at end of file."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        budget = READ_BUDGET_BYTES
        while budget > 0:
            try:
                data = os.read(fd, min(budget, 1 << 20))
            except BlockingIOError:
                return False
            except OSError:
                return True
            if not data:
                return True
            budget -= len(data)
            self._feed(data, entries)
        return False

    def _feed(self, data: bytes, entries: list[tuple[float, bytes]]) -> None:
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return
            data = data[newline + 1 :]
            self._skipping = False
        last = data.rfind(b"\n")
        if last < 0:
            self._keep(data)
            return
        head = bytes(self._line) + data[:last] if self._line else data[:last]
        self._line = bytearray()
        self._keep(data[last + 1 :])
        for line in head.split(b"\n"):
            self._entry(line, entries)

    def _keep(self, tail: bytes) -> None:
        if len(self._line) + len(tail) > MAX_LINE_BYTES:
            self._line = bytearray()
            self._skipping = True
            self.skipped += 1
        else:
            self._line += tail

    def _pump_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        fd = self._proc.stderr.fileno()
        budget = STDERR_BUDGET_BYTES
        while budget > 0:
            try:
                data = os.read(fd, 65536)
            except OSError:  # BlockingIOError included: nothing more now
                return
            if not data:
                return
            budget -= len(data)
            self._stderr += data
            del self._stderr[: -2 * STDERR_LINE_BYTES]

    def _stderr_line(self) -> str | None:
        for line in reversed(bytes(self._stderr).splitlines()):
            if line.strip():
                return line.strip()[-STDERR_LINE_BYTES:].decode("utf-8", "replace")
        return None

    # entries ---------------------------------------------------------------------------------------------------

    def _entry(self, line: bytes, entries: list[tuple[float, bytes]]) -> None:
        """One line of `journalctl -o json`: an object whose field values are strings, null, byte arrays, or
        arrays of those for repeated fields (journalctl(1), "json")."""
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        if not isinstance(entry, dict):
            self.skipped += 1
            return
        cursor = entry.get("__CURSOR")
        if isinstance(cursor, str) and cursor:
            self._cursor = cursor
        micros = _micros(entry.get("__REALTIME_TIMESTAMP"))
        if micros is not None:
            if self._skip_until_us is not None:
                if micros <= self._skip_until_us:
                    return
                self._skip_until_us = None
            self._last_us = micros
        message = _message(entry.get("MESSAGE")) if "MESSAGE" in entry else None
        if message is None:
            self.skipped += 1
            return
        when = micros / 1e6 if micros is not None else time.time()
        entries.append((when, message if message.endswith(b"\n") else message + b"\n"))


def _micros(value: object) -> int | None:
    if isinstance(value, str) and value.isdigit() and len(value) < 20:
        return int(value)
    return None


def _message(value: object) -> bytes | None:
    """MESSAGE as bytes: a string; null (a field over 4096 bytes without --all) as empty; an array of byte numbers
    (not UTF-8); an array of those (a repeated field) joined by newlines. None for anything else."""
    if not isinstance(value, list):
        return _field(value)
    single = _field(value)
    if single is not None:
        return single
    parts = [_field(item) for item in value]
    if parts and all(part is not None for part in parts):
        return b"\n".join(part for part in parts if part is not None)
    return None


def _field(value: object) -> bytes | None:
    """One value of a field: a string, null, or an array of byte numbers."""
    if isinstance(value, str):
        return utf8_bytes(value)
    if value is None:
        return b""
    if isinstance(value, list) and all(type(b) is int and 0 <= b <= 255 for b in value):
        return bytes(value)
    return None

