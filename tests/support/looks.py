"""Looks at servers (`discovery.server.Look`) built as values, for the tests of what reads them (reports, the
history ring, status pages): the real frozen types, so a change to `Look` breaks its fakes loudly, never a
hand-made stand-in of a live `Server`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stallwatch.config import ServerSpec
from stallwatch.discovery.processes import ProcSample
from stallwatch.discovery.server import Launch, Look
from stallwatch.engines import ENGINES
from stallwatch.logs.interpret import LogInterpreter, PhaseSnapshot


def proc(pid: int, create_time: float = 1.7e9, role: str = "main", cpu: float = 0.0, state: str = "S") -> ProcSample:
    """One process of a tree that has used `cpu` seconds (two thirds user, one third system)."""
    return ProcSample(pid, create_time, role, state, cpu * 2 / 3, cpu / 3, 1 << 30, 4)


def phase(engine: str = "sglang") -> PhaseSnapshot:
    """What a fresh interpreter of `engine` says: `stopped`, nothing counted."""
    return LogInterpreter(ENGINES[engine]).snapshot()


def look(name: str = "sglang-30000", engine: str = "sglang", tree: Iterable[ProcSample] = (),
         running: bool = True, launch: Launch | None = None, log: PhaseSnapshot | None = None,
         ranks: tuple[int, int] | None = None, gpus: tuple[int, ...] | None = None, configured: bool = False) -> Look:
    spec = ServerSpec(engine=engine, name=name, gpus=gpus)
    return Look(name, spec, ENGINES[engine], configured, launch or Launch(), running, tuple(tree), {}, ranks,
                log or phase(engine))


@dataclass
class Looked:
    """A server as its readers see it: `look()` gives the look it holds (replace `now` to move it on)."""

    now: Look
    tail: None = None  # no log tail: evidence is off

    @property
    def name(self) -> str:
        return self.now.name

    def look(self) -> Look:
        return self.now


def servers(*names: str) -> list[Looked]:
    return [Looked(look(name)) for name in names]
