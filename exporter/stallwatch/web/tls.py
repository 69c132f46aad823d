"""The server's TLS context, reloaded when its files change."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time

from stallwatch.config.web import TLSServerConfig, build_context

log = logging.getLogger(__name__)


def _mtimes(paths: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((0, 0, 0))
    return tuple(out)


class TLSReloader:
    """The server's TLS context, rebuilt when the certificate, key or CA file changes (checked at most once a
    second, on new connections), as exporter-toolkit re-reads them per handshake (`GetConfigForClient`).
    A broken new file keeps the last good context and logs why (the toolkit fails the handshake instead)."""

    def __init__(self, tls: TLSServerConfig, check_interval: float = 1.0) -> None:
        self.tls = tls
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._stamp = _mtimes(tls.files())
        self._context = build_context(tls)
        self._checked = time.monotonic()
        self._reported: str | None = None

    def context(self) -> ssl.SSLContext:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self.check_interval:
                self._checked = now
                self._maybe_reload()
            return self._context

    def _maybe_reload(self) -> None:
        stamp = _mtimes(self.tls.files())
        if stamp == self._stamp:
            return
        try:
            self._context = build_context(self.tls)
        except (OSError, ssl.SSLError, ValueError) as exc:
            if self._reported != str(exc):
                log.error("TLS files changed but cannot be loaded, keeping the previous ones: %s", exc)
                self._reported = str(exc)
            return
        self._stamp, self._reported = stamp, None
        log.info("TLS certificate reloaded from %s", self.tls.cert_file)
