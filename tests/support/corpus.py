"""The corpus of real logs and the expert's reading of each (`tests/fixtures/logs/readings.yml`), and a replay of a
log through an engine's interpreter as the exporter reads it (a UTF-16 log as UTF-8): the process found first, its
lines one at a time (a tqdm bar's `\\r` updates too), then, where the log ends with its process, the process gone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from stallwatch.engines import ENGINES
from stallwatch.logs.formats import Transcoder
from stallwatch.logs.interpret import LogInterpreter
from support.paths import ROOT

LOGS = ROOT / "tests" / "fixtures" / "logs"


@dataclass(frozen=True)
class Reading:
    """What a log says, read by someone who knows the engine: the phase at its end, the weight shards loaded of
    those expected (a launch's bars summed: a draft model's adds to the target's), and the events that must and
    must not be counted."""

    file: str
    engine: str
    alive: bool  # the process still runs where the log ends
    phase: str
    shards: tuple[int, int] | None = None
    events: frozenset[str] = frozenset()
    not_events: frozenset[str] = frozenset()
    ending: str = ""
    serving_before: bool = False  # an excerpt that begins while the server serves (its probe answered)
    worker: bool = False  # a worker node of a deployment over several: read with the engine's worker rules

    @property
    def path(self) -> Path:
        return LOGS / self.file

    def row(self, got: Seen) -> str:
        mark = "ok " if got.matches(self) else "BAD"
        shards = "-" if got.shards is None else "{}/{}".format(*got.shards)
        return (f"{mark} {self.engine:8} {self.file:58} {self.ending:22} {got.phase:17} {shards:>7} "
                f"{','.join(sorted(got.events)) or '-'}")


@dataclass(frozen=True)
class Seen:
    phase: str
    shards: tuple[int, int] | None
    events: frozenset[str] = field(default_factory=frozenset)
    counts: tuple[tuple[str, int], ...] = ()  # each event counted, by name: what a busy machine must count too

    def matches(self, reading: Reading) -> bool:
        return (self.phase == reading.phase and (reading.shards is None or self.shards == reading.shards)
                and reading.events <= self.events and not reading.not_events & self.events)


def _load() -> list[Reading]:
    out = []
    for entry in yaml.safe_load((LOGS / "readings.yml").read_text()):
        shards = entry.get("shards")
        out.append(Reading(entry["file"], entry["engine"], entry["alive"], entry["phase"],
                           tuple(shards) if shards else None, frozenset(entry.get("events", ())),
                           frozenset(entry.get("not_events", ())), entry.get("ending", ""),
                           entry.get("serving_before", False), entry.get("worker", False)))
    return out


READINGS = _load()


def reading(file: str) -> Reading:
    return next(r for r in READINGS if r.file == file)


def writes(data: bytes) -> list[bytes]:
    """A log's bytes as its writer wrote them, a line at a time: a UTF-16 log's lines end with a whole `\\n` code
    unit. Joined, they are the file again."""
    text = Transcoder()
    text.decode(data[:2])
    if text.codec is None:
        return data.splitlines(keepends=True)
    lines = [line.encode(text.codec) for line in data[2:].decode(text.codec).splitlines(keepends=True)]
    return [data[:2] + lines[0], *lines[1:]] if lines else [data]


def replay(reading: Reading, whole: bool = False) -> Seen:
    """`whole`: the log fed in one block, as a follower far behind reads it, not a line at a time."""
    engine = ENGINES[reading.engine]
    interpreter = LogInterpreter(engine.as_worker() if reading.worker else engine, wall=lambda: 1e9)
    interpreter.process_started(1e9)
    if reading.serving_before:
        interpreter.probe_succeeded(1e9 + 1)
    text = Transcoder().decode(reading.path.read_bytes())
    for line in [text] if whole else text.splitlines(keepends=True):
        for part in [line] if whole else line.split(b"\r"):
            if part.strip():
                interpreter.feed(part if part.endswith(b"\n") else part + b"\n")
    if not reading.alive:
        interpreter.process_gone()
    snap = interpreter.snapshot()
    shards = None if snap.shards_expected is None else (snap.shards_loaded or 0, snap.shards_expected)
    counts = tuple(sorted((event, count) for event, count in snap.events.items() if count))
    return Seen(snap.phase, shards, frozenset(event for event, _ in counts), counts)
