"""Log text fed to an engine's interpreter as the follower hands it over: a line, or one tqdm update, at a time."""

from __future__ import annotations

from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter


def fed(engine: str, *texts: str, interpreter: LogInterpreter | None = None) -> LogInterpreter:
    """The interpreter after `texts`, one line (or one tqdm update) at a time, as the follower hands them over."""
    interpreter = interpreter or LogInterpreter(ENGINES[engine])
    for text in texts:
        for line in text.encode().splitlines(keepends=True):
            for part in line.split(b"\r"):
                interpreter.feed(part if part.endswith(b"\n") else part + b"\n")
    return interpreter


def phase_steps(engine: str, *texts: str) -> list[str]:
    """The phases the interpreter goes through over `texts`, each once in a row."""
    interpreter = LogInterpreter(ENGINES[engine])
    seen: list[str] = []
    for text in texts:
        for line in text.splitlines(keepends=True):
            fed(engine, line, interpreter=interpreter)
            phase = interpreter.snapshot().phase
            if not seen or seen[-1] != phase:
                seen.append(phase)
    return seen
