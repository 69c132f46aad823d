"""Basic auth: checks, the cache of good credentials, and turns at bcrypt per client."""

from __future__ import annotations

import base64
import threading

import bcrypt
import pytest

from stallwatch.web.auth import RECENT, BasicAuth, client_of
from support.harness import poll

HASH = bcrypt.hashpw(b"secret", bcrypt.gensalt(4)).decode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_basic_auth_checks_and_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = BasicAuth({"alice": HASH.encode()})
    header = basic
    assert auth.check(header("alice", "secret"))
    assert not auth.check(header("alice", "wrong")) and not auth.check(header("bob", "secret"))
    assert not auth.check(None) and not auth.check("Bearer x") and not auth.check("Basic !!!")
    assert auth.check(header("alice", "x" * 100), "10.0.0.9") is False  # over bcrypt's 72 bytes: not an exception
    checked: list[bytes] = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, digest: checked.append(digest) or real(password, digest))
    for _ in range(50):
        assert auth.check(header("alice", "secret"))
    assert checked == []  # cached: no bcrypt check for credentials already found good


def test_a_client_is_an_ipv4_address_or_an_ipv6_64_in_a_24_or_a_48() -> None:
    assert client_of("::ffff:10.1.2.3") == client_of("10.1.2.3") == ("10.1.2.3", "10.1.2.0/24")
    assert client_of("2001:db8::66") == client_of("2001:db8:0:0:ffff::1") == ("2001:db8::/64", "2001:db8::/48")
    assert client_of("2001:db8:0:1::66") == ("2001:db8:0:1::/64", "2001:db8::/48") and client_of("") == ("", "")
    assert client_of("fe80::1%eth0") == ("fe80::/64", "fe80::/48")


def _in_thread(results: dict[str, bool | None], name: str, auth: BasicAuth, header: str, peer: str) -> threading.Thread:
    thread = threading.Thread(target=lambda: results.__setitem__(name, auth.check(header, peer)), daemon=True)
    thread.start()
    return thread


@pytest.fixture
def release(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """bcrypt held for every password but `secret` until the event is set."""
    held, real = threading.Event(), bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, digest: (password == b"secret" or held.wait(30))
                        and real(password, digest))
    return held


def _contest(auth: BasicAuth, release: threading.Event, running: tuple[str, str], waiting: tuple[str, str],
             scraper: tuple[str, str]) -> dict[str, bool | None]:
    """A guess inside bcrypt (held), another waiting for its turn, then the scraper's check: each one's answer."""
    results: dict[str, bool | None] = {}
    threads = [_in_thread(results, "running", auth, *running)]
    poll(lambda: auth._turns._running, what="a guess inside bcrypt")
    threads.append(_in_thread(results, "waiting", auth, *waiting))
    poll(lambda: auth._turns._queue, what="a guess waiting")
    threads.append(_in_thread(results, "scraper", auth, *scraper))
    poll(lambda: "waiting" in results, what="the waiting guess refused for the scraper")
    release.set()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.parametrize(("waiting", "scraper"), [("10.0.0.67", "10.0.0.1"), ("10.0.0.68", "192.0.2.1")],
                         ids=["address-failed", "network-failed"])
def test_a_flood_of_wrong_passwords_lets_a_scraper_with_the_right_one_through(
        release: threading.Event, waiting: str, scraper: str) -> None:
    """A flood of wrong passwords took every turn at bcrypt, so a scraper whose password was not cached yet (after
    any restart, every scraper) got 429 for as long as the flood lasted (docs/research/audit-2026-12-02.md #9).
    While one guess holds bcrypt (held here until the end), the flooding client's further guesses are refused at once,
    a guess from an address that failed before (or a fresh one in its /24, against a scraper from another network)
    gives up its waiting turn to the scraper, and the scraper, checked next, is let in; the flooder's own address then
    waits out its failure delay."""
    auth = BasicAuth({"alice": HASH.encode(), "bob": HASH.encode()})
    release.set()
    assert auth.check(basic("bob", "guess"), "10.0.0.67") is False  # that address has failed before
    release.clear()
    results: dict[str, bool | None] = {}
    threads = [_in_thread(results, "flood", auth, basic("alice", "guess0"), "2001:db8::66")]
    poll(lambda: auth._turns._running, what="the first guess inside bcrypt")
    threads.append(_in_thread(results, "failed before", auth, basic("alice", "guess1"), waiting))
    poll(lambda: auth._turns._queue, what="the second guess waiting")
    assert [auth.check(basic("alice", f"guess{i}"), "2001:db8::1:2") for i in range(2, 20)] == [None] * 18  # same /64
    threads.append(_in_thread(results, "scraper", auth, basic("bob", "secret"), scraper))
    poll(lambda: "failed before" in results, what="the waiting guess refused for the scraper")
    release.set()
    for thread in threads:
        thread.join(30)
    assert results == {"flood": False, "failed before": None, "scraper": True}
    assert auth.check(basic("alice", "guess20"), "2001:db8::66") is None  # within its failure delay
    assert auth.check(basic("alice", "secret"), scraper)  # another client: checked now


def test_random_user_names_from_the_scrapers_own_address_do_not_keep_it_out(release: threading.Event) -> None:
    """Guesses with random user names, each a (client, user name) of its own, from the scraper's own address (a
    neighbour on the node) ranked as the scraper did, so that the first to come took the waiting turn: a scraper
    whose password was not cached yet got 429 for as long as the flood lasted (docs/research/audit-2026-12-02.md #9).
    Unknown names share one lane, which fails with their first guess: the scraper's lane has not, so it takes the
    waiting turn from the guess holding it and is let in next."""
    auth = BasicAuth({"alice": HASH.encode(), "bob": HASH.encode()})
    release.set()
    assert auth.check(basic("mallory", "guess"), "10.0.0.1") is False
    release.clear()
    results = _contest(auth, release, (basic("trudy", "guess"), "10.0.0.1"), (basic("eve", "guess"), "10.0.0.1"),
                       (basic("bob", "secret"), "10.0.0.1"))
    assert results == {"running": False, "waiting": None, "scraper": True}


def test_a_client_let_in_before_goes_ahead_of_guesses_from_clean_addresses(release: threading.Event) -> None:
    """Guesses from a fresh address in a fresh network each time ranked as a scraper's first check does: one whose
    host was let in minutes before (its password rotated, or a new replica beside it) took the waiting turn only if
    it came first (docs/research/audit-2026-12-02.md #9: "the most recent successes' addresses first"). A client let
    in within `RECENT` s (by bcrypt or from the cache), and not failed since, takes the waiting turn from such a
    guess."""
    clock = [1000.0]
    auth = BasicAuth({"alice": HASH.encode(), "bob": HASH.encode()}, clock=lambda: clock[0])
    assert auth.check(basic("alice", "secret"), "10.0.0.5")  # its host was let in
    clock[0] += RECENT
    assert auth.check(basic("alice", "secret"), "10.0.0.5")  # and keeps scraping, from the cache
    clock[0] += RECENT - 1
    results = _contest(auth, release, (basic("alice", "guess1"), "10.0.1.1"), (basic("alice", "guess2"), "10.0.2.1"),
                       (basic("bob", "secret"), "10.0.0.5"))
    assert results == {"running": False, "waiting": None, "scraper": True}
    assert auth.check(basic("alice", "guess3"), "10.0.0.5") is False  # a failure: no longer ahead
    assert auth._turns._client(("10.0.0.5", None)).let_in_at < 0
