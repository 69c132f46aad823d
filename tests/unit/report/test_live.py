"""Status pages' stack rounds: a page never waits for another server's stacks and waits a bounded time for its own."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from stallwatch.report import live
from stallwatch.report.live import StatusPages
from stallwatch.report.model import ProcessInfo, StackGroup
from support.harness import poll
from support.looks import Looked, servers


def _pages(servers: list[Looked]) -> StatusPages:
    runtime = SimpleNamespace(config=SimpleNamespace(web=SimpleNamespace(show_evidence=True)),
                              watcher=SimpleNamespace(servers=lambda: list(servers)))
    return StatusPages(runtime)  # type: ignore[arg-type]


def _tree(pid: int) -> list[ProcessInfo]:
    return [ProcessInfo(pid, "main", "S", 0.0, "")]


def test_a_page_never_waits_for_another_servers_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile Python tree (300 threads of 900 frames) made its py-spy round take 12 s under one lock for all
    servers, so an ordinary server's page waited 11.6 s for it (docs/research/audit-2026-12-01.md #8). While one
    server's stack round is stuck, another server's page takes its own stacks at once."""
    entered, release = threading.Event(), threading.Event()

    def fake_stacks(processes: list[ProcessInfo]) -> list[StackGroup]:
        if processes[0].pid == 1:  # the hostile server's py-spy round, 12 s in docs/research/audit-2026-12-01.md #8
            entered.set()
            release.wait(30)
        return [StackGroup(["main"], [processes[0].pid], [], "")]

    monkeypatch.setattr(live, "stacks", fake_stacks)
    pages = _pages(servers("slow", "quick"))
    hostile = threading.Thread(target=pages._stacks_of, args=("slow", _tree(1)))
    hostile.start()
    try:
        assert entered.wait(10)
        other = threading.Thread(target=pages._stacks_of, args=("quick", _tree(2)))
        other.start()
        other.join(5)
        assert not other.is_alive(), "the page waited for another server's py-spy round"
    finally:
        release.set()
        hostile.join(10)


def test_a_page_waits_a_bounded_time_for_its_own_servers_slow_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile tree's py-spy round runs py-spy's whole timeout: the page waits STACK_WAIT_SECONDS for it, shows
    the stacks taken before, and the next view, once the round ended, shows the new ones; reloads meanwhile start no
    second round."""
    rounds, release = [], threading.Event()

    def fake_stacks(processes: list[ProcessInfo]) -> list[StackGroup]:
        rounds.append(processes[0].pid)
        if len(rounds) == 2:
            release.wait(30)
        return [StackGroup(["main"], [len(rounds)], [], "")]

    monkeypatch.setattr(live, "stacks", fake_stacks)
    monkeypatch.setattr(live, "STACK_TTL_SECONDS", 0.0)
    monkeypatch.setattr(live, "STACK_WAIT_SECONDS", 0.3)
    pages = _pages(servers("hostile"))
    assert pages._stacks_of("hostile", _tree(1))[0].pids == [1]  # a quick round: waited for
    try:
        # The slow round blocks until `release`: a page that waited for it would see its stacks (2), not the last (1).
        assert pages._stacks_of("hostile", _tree(1))[0].pids == [1]
        assert pages._stacks_of("hostile", _tree(1))[0].pids == [1]
        assert len(rounds) == 2, "a reload started a second round beside the one under way"
    finally:
        release.set()
    poll(lambda: pages._stacks_of("hostile", _tree(1))[0].pids[0] >= 2, what="the slow round's stacks")


def test_stacks_of_a_forgotten_server_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stacks kept for each server's page were never pruned, not even for forgotten servers, so servers that any
    user starts and stops grew the exporter's memory (docs/research/audit-2026-12-01.md #8). The stacks of a server
    that is no longer watched are dropped at the next page view of another one."""
    monkeypatch.setattr(live, "stacks", lambda processes: [StackGroup(["main"], [processes[0].pid], [], "")])
    watched = servers("gone", "kept")
    pages = _pages(watched)
    for server in watched:
        pages._stacks_of(server.name, _tree(7))
    watched.pop(0)
    pages._stacks_of("kept", _tree(7))
    assert set(pages._stacks) == {"kept"}
