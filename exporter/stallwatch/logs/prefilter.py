"""The literal prefilter: from a set of log rules, one regex of the literals that every match must
contain, so that the hot path scans whole blocks of lines in the regex engine and only the lines it hits
are matched against the rules, and only against the rules whose literals the line holds. Built on `re`'s own
parser (private API, stable from 3.10 to 3.13)."""

from __future__ import annotations

import re
from collections.abc import Iterator
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
    regex: re.Pattern[bytes]  # all rules, one named group each
    rules: dict[str, Rule]  # group name -> rule
    branches: dict[str, re.Pattern[bytes]]  # group name -> its branch of `regex` alone, in `regex`'s order
    groups_of: dict[bytes, tuple[str, ...]]  # a literal -> the groups whose match may hold it, in order

    def matches(self, data: bytes, start: int, end: int, at: int) -> Iterator[tuple[str, re.Match[bytes]]]:
        """What `regex.finditer(data, start, end)` finds, as (group, match), in a line whose first prefilter hit
        is at `at`. Only the branches of the literals found from `at` on are run: the whole alternation, tried
        at every byte, costs about a microsecond a byte."""
        if self.prefilter is None:
            yield from ((m.lastgroup or "", m) for m in self.regex.finditer(data, start, end))
            return
        words: set[bytes] = set()
        hit = self.prefilter.search(data, at, end)
        while hit is not None:  # from the next byte, not the hit's end: literals may overlap
            words.add(hit.group())
            hit = self.prefilter.search(data, hit.start() + 1, end)
        groups = self.groups_of[words.pop()] if len(words) == 1 else sorted(
            {group for word in words for group in self.groups_of[word]}, key=list(self.branches).index)
        if len(groups) == 1:  # the common line: one rule's literal
            yield from ((groups[0], m) for m in self.branches[groups[0]].finditer(data, start, end))
            return
        branches = [(group, self.branches[group]) for group in groups]
        pos = start
        while True:
            # The leftmost match, the first branch at a tie (`min` keeps the first): what the alternation picks.
            hits = [(m, group) for group, branch in branches if (m := branch.search(data, pos, end))]
            if not hits:
                return
            match, group = min(hits, key=lambda hit: hit[0].start())
            yield group, match
            pos = max(match.end(), match.start() + 1)


def line_bounds(block: bytes, floor: int, at: int, newline: int) -> tuple[int, int]:
    """The line (ended by `\\n` or `\\r`) that holds `at`, found between a line start `floor` and the next `\\n`
    at `newline` (the block's length when there is none): `\\r` is looked for only inside those bounds, so that
    a block without one is not searched to its ends for each hit."""
    start = max(floor, block.rfind(b"\n", floor, at) + 1)
    start = max(start, block.rfind(b"\r", start, at) + 1)
    carriage = block.find(b"\r", at, newline)
    return start, newline if carriage < 0 else carriage


def compile_rules(rules: list[Rule], shards: re.Pattern[bytes] | None) -> Compiled:
    branches: dict[str, bytes] = {}
    needs: dict[str, list[bytes]] = {}
    literals: set[bytes] | None = set()
    patterns = [(f"r{i}", r.pattern.pattern) for i, r in enumerate(rules)]
    if shards is not None:  # first: a shard line is also a loading_weights line
        patterns.insert(0, (SHARDS, shards.pattern))
    for group, pattern in patterns:
        branches[group] = strip_groups(pattern)
        needed = required_literals(pattern)
        needs[group] = needed or []
        literals = None if literals is None or needed is None else literals | set(needed)
    by_group = {f"r{i}": r for i, r in enumerate(rules)}
    regex = re.compile(b"|".join(b"(?P<%s>%s)" % (g.encode(), b) for g, b in branches.items()) or b"(?!)",
                       re.MULTILINE)
    words = sorted(literals or ())
    # A literal found holds every shorter one it begins with: the trie matches the longest at each position.
    groups_of = {word: tuple(g for g, need in needs.items() if any(word.startswith(n) for n in need))
                 for word in words}
    return Compiled(None if literals is None else re.compile(_trie(words) or b"(?!)"), regex, by_group,
                    {g: re.compile(b, re.MULTILINE) for g, b in branches.items()}, groups_of)


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
    branches = [i for i, (op, _) in enumerate(parsed) if op is _sre_constants.BRANCH]
    if len(branches) == 1:  # `a|b`, or `x(?:a|b)y` as the parser factors `xa|xb` out: each way through it
        at = branches[0]
        out: list[bytes] = []
        for branch in parsed[at][1][1]:  # type: ignore[index]
            found = _longest_literal([*parsed[:at], *branch, *parsed[at + 1:]])
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
