"""The literal prefilter: from a set of log rules, one regex of the literals that every match must
contain, so that the hot path scans whole blocks of lines in the regex engine and only the lines it hits
are matched against the rules. Built on `re`'s own parser (private API, stable from 3.10 to 3.13)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from stallwatch.engines.base import Rule

try:  # Python 3.11+
    import re._constants as _sre_constants
    import re._parser as _sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

SHARDS = "shards"  # the group name of the shard-progress pattern
_MIN_LITERAL = 4


@dataclass(frozen=True)
class Compiled:
    prefilter: re.Pattern[bytes] | None  # literals that every rule's match contains; None: scan every line
    regex: re.Pattern[bytes]  # all rules, one named group each, run only on candidate lines
    rules: dict[str, Rule]  # group name -> rule


def compile_rules(rules: list[Rule], shards: re.Pattern[bytes] | None) -> Compiled:
    parts: list[bytes] = []
    literals: set[bytes] | None = set()
    patterns = [(f"r{i}", r.pattern.pattern) for i, r in enumerate(rules)]
    if shards is not None:  # first: a shard line is also a loading_weights line
        patterns.insert(0, (SHARDS, shards.pattern))
    for group, pattern in patterns:
        parts.append(b"(?P<%s>%s)" % (group.encode(), strip_groups(pattern)))
        needed = required_literals(pattern)
        literals = None if literals is None or needed is None else literals | set(needed)
    by_group = {f"r{i}": r for i, r in enumerate(rules)}
    prefilter = None if literals is None else re.compile(_trie(sorted(literals)) or b"(?!)")
    return Compiled(prefilter, re.compile(b"|".join(parts) or b"(?!)", re.MULTILINE), by_group)


def strip_groups(pattern: bytes) -> bytes:
    """A rule as one branch of the combined alternation: its capturing groups become non-capturing, and
    leading global flags such as `(?i)` become scoped ones, which is all Python allows mid-pattern."""
    pattern = re.sub(rb"(?<!\\)\((?!\?)", b"(?:", pattern)
    flags = re.match(rb"\(\?([imsx]+)\)", pattern)
    return b"(?%s:%s)" % (flags.group(1), pattern[flags.end():]) if flags else pattern


def required_literals(pattern: bytes) -> list[bytes] | None:
    """Literal strings one of which every match of `pattern` contains; None when there are none to use."""
    tree = _sre_parse.parse(pattern.decode("latin-1"))
    if tree.state.flags & re.IGNORECASE:
        return None  # a literal would miss the other cases
    parsed = list(tree)
    if len(parsed) == 1 and parsed[0][0] is _sre_constants.BRANCH:
        out: list[bytes] = []
        for branch in parsed[0][1][1]:
            found = _longest_literal(list(branch))
            if found is None:
                return None
            out.append(found)
        return out
    found = _longest_literal(parsed)
    return None if found is None else [found]


def _longest_literal(items: list[tuple[object, object]]) -> bytes | None:
    """The literal run to prefilter on. Runs are cut to begin at a capital letter or `_` where that leaves
    enough, because the regex engine skips positions by first byte, and lower-case letters are everywhere."""
    runs, run = [], bytearray()
    for op, arg in [*items, (None, None)]:
        if op is _sre_constants.LITERAL:
            run.append(arg)  # type: ignore[arg-type]
            continue
        if run:
            runs.append(bytes(run))
        run = bytearray()
    capitalised = [r[m.start():] for r in runs
                   if (m := re.search(rb"[A-Z_]", r)) and len(r) - m.start() >= _MIN_LITERAL]
    candidates = capitalised or [r for r in runs if len(r) >= _MIN_LITERAL]
    return max(candidates, key=len) if candidates else None


def _trie(words: list[bytes]) -> bytes:
    """One regex for many literals, factored by common prefixes (the regex engine then rarely backtracks)."""
    root: dict = {}
    for word in words:
        node = root
        for byte in word:
            node = node.setdefault(byte, {})
        node[None] = {}

    def build(node: dict) -> bytes:
        branches = [re.escape(bytes([b])) + build(child) for b, child in sorted(
            ((k, v) for k, v in node.items() if k is not None))]
        if not branches:
            return b""
        body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
        return b"(?:" + body + b")?" if None in node else body

    return build(root)
