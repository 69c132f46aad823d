"""A background loop that calls one function now and then every `interval` seconds until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def run_every(interval: float, action: Callable[[], None], name: str, stop: threading.Event,
              delay_first: bool = False) -> threading.Thread:
    """A daemon thread running `action` (first after `interval` when `delay_first`) until `stop` is set; a call
    that raises is logged and the loop goes on."""
    def loop() -> None:
        if delay_first and stop.wait(interval):
            return
        while True:
            try:
                action()
            except Exception:
                log.exception("%s failed", name)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread
