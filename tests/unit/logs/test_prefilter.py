"""The literal prefilter finds the same lines as the rules one by one, and only runs the rules of the literals found."""

from __future__ import annotations

import re

import pytest

from stallwatch.engines import ENGINES
from stallwatch.engines.base import CHECKPOINT_SHARDS, Rule, rule
from stallwatch.logs.interpret import Matcher
from stallwatch.logs.prefilter import SHARDS, compile_rules, required_literals, strip_groups
from support import transcripts


def test_only_the_rules_of_the_literals_found_run_and_find_what_the_whole_alternation_finds() -> None:
    """The alternation of every rule, tried at each byte, cost a millisecond for a 4 KiB line."""
    texts = [transcripts.sglang_healthy(), transcripts.sglang_graph_crash(), transcripts.sglang_nccl_timeout(),
             transcripts.vllm_healthy(), transcripts.vllm_shm_stall(), transcripts.vllm_v0(),
             transcripts.tgi_healthy(), transcripts.tgi_shard_crash(), transcripts.llamacpp_load_error()]
    lines = [line for text in texts for line in text.encode().replace(b"\r", b"\n").split(b"\n")]
    checked = 0
    for engine in ENGINES.values():
        matcher = Matcher(engine)
        for compiled in (matcher.startup, matcher.serving):
            assert compiled.prefilter is not None
            for line in lines:
                hit = compiled.prefilter.search(line)
                whole = [(m.lastgroup, m.span()) for m in compiled.regex.finditer(line)]
                found = [] if hit is None else [(group, m.span()) for group, m in
                                                 compiled.matches(line, 0, len(line), hit.start())]
                assert found == whole, (engine.name, line)
                checked += bool(whole)
    assert checked > 300
    # Literals that overlap: a search that went on after the first one's end would not see the second one's rule,
    # whose match begins further left and so is the one the alternation finds.
    overlapping = compile_rules([rule("xabc", event="fatal"), rule("q.*bcdz", event="oom")], None)
    line = b"q xabcdz"
    assert [m.lastgroup for m in overlapping.regex.finditer(line)] == ["r1"]
    assert [group for group, _ in overlapping.matches(line, 0, len(line), line.index(b"xabc"))] == ["r1"]


@pytest.mark.parametrize(("pattern", "literals"), [
    (rb"Load weight begin\.", [b"Load weight begin."]),
    (rb"Shard \d+ crashed|Webserver Crashed", [b"Shard ", b"Webserver Crashed"]),
    (rb"crashed with exit code -?\d+\. Triggering SIGQUIT", [b"Triggering SIGQUIT"]),
    (rb"^\d+ \w+", None),
    (rb"(?i)panic: out of disk", None),
    (rb"abc|\d+", None),  # one branch without a literal: every line is a candidate
])
def test_required_literals(pattern: bytes, literals: list[bytes] | None) -> None:
    assert required_literals(pattern) == literals


@pytest.mark.parametrize(("pattern", "stripped"), [
    (rb"(a|b) (?:c)", rb"(?:a|b) (?:c)"),
    (rb"\(literal\) (x)", rb"\(literal\) (?:x)"),
    (rb"(?i)panic: (\w+)", rb"(?i:panic: (?:\w+))"),
    (rb"(?P<x>y)", rb"(?P<x>y)"),  # named groups are the engine's own; they stay
])
def test_strip_groups(pattern: bytes, stripped: bytes) -> None:
    assert strip_groups(pattern) == stripped


def test_compiled_rules_find_the_same_lines_as_the_rules_one_by_one() -> None:
    rules = list(ENGINES["sglang"].all_rules())
    compiled = compile_rules(rules, CHECKPOINT_SHARDS)
    assert compiled.prefilter is not None
    lines = [
        b"[2026-11-20 09:14:13 TP0] Load weight begin. avail mem=78.54 GB",
        b"Loading safetensors checkpoint shards:  50% Completed | 32/64 [01:02<01:02]",
        b"[2026-11-20 09:20:00] The server is fired up and ready to roll!",
        b"[2026-11-20 09:21:00 TP0] Decode batch, #running-req: 3, #token: 120",
        b"[2026-11-20 09:21:00] nothing to see here",
        b"Traceback (most recent call last):",
    ]
    for line in lines:
        expected = {f"r{i}" for i, r in enumerate(rules) if r.pattern.search(line)}
        if CHECKPOINT_SHARDS.search(line):
            expected.add(SHARDS)
        found = {m.lastgroup for m in compiled.regex.finditer(line)}
        assert found == expected, line
        assert bool(compiled.prefilter.search(line)) >= bool(expected), line  # never misses a match


def test_a_rule_without_literals_disables_the_prefilter() -> None:
    compiled = compile_rules([rule(r"Load weight begin\.", phase="loading_weights"),
                              rule(r"^\d{3}$", phase="serving")], None)
    assert compiled.prefilter is None
    assert compiled.regex.search(b"200")


def test_prefilter_is_a_prefix_trie() -> None:
    compiled = compile_rules([rule("Shard ready in", phase="warming_up"), rule("Shard crashed", event="fatal")],
                             None)
    assert compiled.prefilter is not None
    assert compiled.prefilter.pattern.count(b"Shard") == 1
    assert re.search(compiled.prefilter, b"x Shard crashed") and not re.search(compiled.prefilter, b"Shard gone")


def test_every_built_in_rule_gives_the_prefilter_a_literal() -> None:
    """One rule without a literal turns the prefilter off for the engine's whole set (every line scanned)."""
    for engine in ENGINES.values():
        for r in (*engine.all_rules(), *([Rule(engine.shards)] if engine.shards else [])):
            assert required_literals(r.pattern.pattern) is not None, (engine.name, r.pattern.pattern)
