"""The config file read and validated: every input is loaded or refused with `file:line: key: reason`, and hostile or
fuzzed files never crash the reader."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stallwatch.config import Config
from stallwatch.config.reader import ConfigError
from support.configs import GOOD, parse


def _mutation(rng: random.Random) -> str:
    """One hostile fragment: the shapes that gave the reader tracebacks when it was fuzzed, and random bytes."""
    return rng.choice([
        "[" * rng.randint(10, 3000), "{a: " * rng.randint(10, 3000), "!foo ", "!!binary ", "!!python/tuple ",
        "0x" + "f" * rng.randint(300, 2000), ".inf", "-.inf", ".nan", "1e999", "-1", "'(?u)x'", "'\\N{DIGIT ONE}'",
        "'a{99999999999}'", "'" + "(" * 500 + "'", '"\\ud800"', '"\\0"', "&a [*a]", "*nowhere", "? [k]: v",
        "2024-13-45", "'a{1000}{1000}{1000}'", "\t", ": :", "- - -", "~",
        "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(1, 20))),
    ])


def _fuzzed(rng: random.Random) -> str:
    lines = GOOD.splitlines()
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        head, _, value = lines[i].partition(": ")
        lines[i] = f"{head}: {_mutation(rng)}" if value and rng.random() < 0.7 else _mutation(rng)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "line", "key", "reason"),
    [
        ("servers:\n  - engine: sglang\n    colour: red\n", 3, "servers[0].colour", "unknown key"),
        ("gpu:\n  enabled: yes please\n", 2, "gpu.enabled", "expected true or false"),
        ("servers:\n  - engine: sglang\n    match: {cmdline: '(unclosed'}\n", 3, "servers[0].match.cmdline",
         "invalid regular expression"),
        ("servers:\n  - engine: sglang\n    probes:\n      - url: http://h/health\n        timeout: soon\n", 5,
         "servers[0].probes[0].timeout", "expected a duration"),
        ("servers:\n  - engine: sglang\n    stall: {gpu_memory_bytes: 70 gigs}\n", 3,
         "servers[0].stall.gpu_memory_bytes", "expected a size"),
        ("servers:\n  - {engine: sglang, name: a}\n  - {engine: vllm, name: a}\n", 3, "servers[1].name",
         "duplicate server name"),
        ("servers:\n  - engine: mlc-llm\n", 2, "servers[0].engine", "expected one of sglang, vllm"),
        ("servers:\n  - name: x\n", 2, "servers[0].engine", "missing"),
        ("servers:\n  - engine: generic\n", 2, "servers[0].match.cmdline", "required for engine 'generic'"),
        ("servers:\n  - engine: sglang\n    gpus: [0, -1]\n", 3, "servers[0].gpus[1]", "expected a GPU index"),
        ("servers:\n  - engine: generic\n    match: {cmdline: x}\n    patterns: {booting: [x]}\n", 4,
         "servers[0].patterns.booting", "unknown key"),
        ("servers: {engine: sglang}\n", 1, "servers", "expected a list"),
        ("servers:\n  - engine: sglang\n    engine: vllm\n", 3, "servers[0].engine", "duplicate key"),
        ("servers:\n  - engine: sglang\n    probes: [{url: 'ftp://x'}]\n", 3, "servers[0].probes[0].url",
         "expected an http"),
        ("web:\n  show_evidence: maybe\n", 2, "web.show_evidence", "expected true or false"),
        ("web:\n  history_interval: 0s\n", 2, "web.history_interval", "expected"),
        ("servers:\n  - engine: sglang\n    pd_group: 'kimi\"} or vector(1)'\n", 3, "servers[0].pd_group",
         "expected a group name"),
        ("servers:\n  - engine: vllm\n    pd_role: router\n", 3, "servers[0].pd_role",
         "expected one of prefill, decode"),
        ("servers:\n  - engine: sglang\n    match: {user: no-such-user-here}\n", 3, "servers[0].match.user",
         "expected a uid (0 to 4294967294) or a user name known on this system, got 'no-such-user-here'"),
        ("servers:\n  - engine: sglang\n    match: {user: -1}\n", 3, "servers[0].match.user", "expected a uid"),
        ("servers:\n  - engine: sglang\n    match: {user: true}\n", 3, "servers[0].match.user", "expected a uid"),
    ],
)
def test_bad_config_names_file_line_key_and_reason(text: str, line: int, key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse(text, file="c.yml")
    assert str(error.value).startswith(f"c.yml:{line}: {key}: "), error.value
    assert reason in str(error.value)


def test_a_configured_pd_group_is_kept() -> None:
    assert parse("servers:\n  - {engine: sglang, pd_group: llm/kimi-pd}\n").servers[0].pd_group == "llm/kimi-pd"
    assert parse("servers:\n  - {engine: sglang}\n").servers[0].pd_group is None


def test_a_configured_pd_role_is_kept() -> None:
    assert parse("servers:\n  - {engine: vllm, pd_role: decode}\n").servers[0].pd_role == "decode"
    assert parse("servers:\n  - {engine: vllm}\n").servers[0].pd_role is None


def test_a_configured_user_is_a_uid() -> None:
    """`match.user`: a uid or a name of the exporter's user database; without it, the GPU holder's (the watcher)."""
    users = [parse(f"servers:\n  - {{engine: sglang, match: {{user: {u}}}}}\n").servers[0].user for u in ("root", 1001)]
    assert users == [0, 1001]
    assert parse("servers:\n  - {engine: sglang}\n").servers[0].user is None


def test_invalid_yaml_names_its_line() -> None:
    with pytest.raises(ConfigError, match=r"^c\.yml:3: invalid YAML"):
        parse("servers:\n  - engine: sglang\n   bad: [\n", file="c.yml")


def test_generic_patterns_become_rules() -> None:
    config = parse("servers:\n  - engine: generic\n    match: {cmdline: 'my-server'}\n"
                   "    patterns:\n      serving: ['ready to serve']\n      events: {fatal: ['PANIC']}\n")
    rules = config.servers[0].rules
    assert [(r.phase, r.event) for r in rules] == [("serving", None), (None, "fatal")]
    with pytest.raises(ConfigError):
        parse("servers:\n  - engine: generic\n    match: {cmdline: x}\n    patterns: {events: {boom: [x]}}\n")


def test_defaults_apply_where_a_server_is_silent() -> None:
    config = parse("defaults:\n  stall: {log_stale: 3m}\n  probe: {timeout: 2s}\n"
                   "servers:\n  - engine: sglang\n    stall: {gpu_memory_bytes: 70GB}\n"
                   "    probes: [{url: 'http://127.0.0.1:1/health', interval: 1s}]\n")
    server = config.servers[0]
    assert (server.stall.gpu_memory_bytes, server.stall.log_stale) == (70e9, 180)
    assert server.probes is not None
    probe = server.probes[0]
    assert (probe.url, probe.timeout, probe.interval) == ("http://127.0.0.1:1/health", 2, 1)
    assert parse("").defaults.probe.interval == 15


def test_probe_without_url_and_defaults_probe_with_url_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"servers\[0\]\.probes\[0\]\.url: missing"):
        parse("servers:\n  - engine: sglang\n    probes: [{timeout: 1s}]\n")
    with pytest.raises(ConfigError, match=r"defaults\.probe\.url: unknown key"):
        parse("defaults:\n  probe: {url: 'http://x/'}\n")


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ('servers:\n  - {engine: sglang, name: "x\\ud800"}\n', "servers[0].name", "valid Unicode"),  # a lone surrogate
        ("discovery: {interval: .inf}\n", "discovery.interval", "duration from 0"),
        ("discovery: {interval: .nan}\n", "discovery.interval", "duration from 0"),
        ("discovery: {interval: -5}\n", "discovery.interval", "duration from 0"),
        ("discovery: {interval: 99999999999999999999h}\n", "discovery.interval", "duration from 0"),
        ("discovery: {forget_after: .inf}\n", "discovery.forget_after", "duration from 0"),
        ("defaults: {stall: {gpu_memory_bytes: .inf}}\n", "defaults.stall.gpu_memory_bytes", "size from 0"),
        ("defaults: {stall: {gpu_memory_bytes: .nan}}\n", "defaults.stall.gpu_memory_bytes", "size from 0"),
        ("defaults: {stall: {gpu_memory_bytes: 0x" + "f" * 300 + "}}\n", "defaults.stall.gpu_memory_bytes",
         "out of range"),
        ('servers:\n  - {engine: sglang, logs: ["/var/log/a\\0b"]}\n', "servers[0].logs[0]", "NUL"),
        ("servers:\n  - {engine: generic, match: {cmdline: x}, patterns: {serving: ['(?u)ready']}}\n",
         "servers[0].patterns.serving[0]", "invalid regular expression"),
        ("servers:\n  - {engine: generic, match: {cmdline: x}, patterns: {serving: ['\\N{DIGIT ONE}']}}\n",
         "servers[0].patterns.serving[0]", "invalid regular expression"),
        ("servers:\n  - {engine: generic, match: {cmdline: 'a{4294967296}'}}\n", "servers[0].match.cmdline",
         "invalid regular expression"),
        ("servers:\n  - {engine: generic, match: {cmdline: '" + "a" * 5000 + "'}}\n", "servers[0].match.cmdline",
         "longer than"),
        ("servers: !foo [1]\n", "servers", "unsupported tag"),
        ("gpu: !!python/object:os.system {}\n", "gpu", "unsupported tag"),
        ("servers:\n  - {engine: sglang, probes: [{url: 'http://127.0.0.1:99999/health'}]}\n",
         "servers[0].probes[0].url", "out of range"),
        ("{[a]: 1}\n", "<a list>", "unknown key"),
        ("a: " + "[" * 40 + "]" * 40 + "\n", "a", "nested deeper"),
    ],
)
def test_bad_values_are_refused_with_file_line_and_key(tmp_path: Path, text: str, key: str, reason: str) -> None:
    """A config file whose values once crashed the reader or slipped through (a lone surrogate in a name, `.inf`,
    `.nan` or negative durations, a 300-digit size, a NUL in a log path, regular expressions that do not compile or
    run to 5,000 characters, `!foo` and `!!python/object` tags, a list as a key, 40 levels of nesting) is refused
    with a ConfigError that starts `file:line:` and names the key and the reason. None of them gives a traceback or a
    value the exporter would run with."""
    with pytest.raises(ConfigError) as refused:
        parse(text, file="c.yml")
    assert f": {key}" in str(refused.value) and reason in str(refused.value)
    assert str(refused.value).startswith("c.yml:")


def test_fuzzed_configs_load_or_are_refused() -> None:
    """200 copies of a good config with one to three lines replaced by hostile fragments (deep brackets, explicit
    tags, huge numbers, `.nan`, bad regular expressions, aliases, lone surrogates, random characters) each either
    load or are refused with a ConfigError that names the file, never another exception; more than half are refused."""
    rng = random.Random(11)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(200):
        text = _fuzzed(rng)
        try:
            assert isinstance(parse(text, file="f.yml"), Config)
            outcomes["loaded"] += 1
        except ConfigError as exc:
            assert str(exc).startswith("f.yml"), exc
            outcomes["refused"] += 1
    assert outcomes["refused"] > 100, outcomes


@pytest.mark.parametrize(("text", "key", "floor"), [
    ("web: {history_interval: 10ms}\n", "web.history_interval", "0.5s"),
    ("discovery: {interval: 0.001s}\n", "discovery.interval", "0.1s"),
    ("defaults: {probe: {interval: 1ms}}\n", "defaults.probe.interval", "0.1s"),
    ("servers:\n  - {engine: sglang, probes: [{url: 'http://127.0.0.1:1/health', interval: 50ms}]}\n",
     "servers[0].probes[0].interval", "0.1s"),
    ("logs: {poll_interval: 20ms}\n", "logs.poll_interval", "0.1s"),
    ("engine_metrics: {interval: 10ms}\n", "engine_metrics.interval", "0.1s"),
    ("gpu: {sample_interval: 1ms}\n", "gpu.sample_interval", "0.1s"),
])
def test_intervals_below_their_floor_are_refused(text: str, key: str, floor: str) -> None:
    """A config with `web.history_interval: 10ms` sized the history ring at 360,001 points per server, 0.4 MiB/s more
    with 10 servers, and loop intervals of a millisecond spin discovery, probes and polls
    (docs/research/audit-2026-12-01.md #16). Each interval below its floor (0.5 s for the history ring, 0.1 s for
    every loop) is refused with `file:line: key: expected a duration of at least ...`."""
    with pytest.raises(ConfigError) as refused:
        parse(text, file="c.yml")
    message = str(refused.value)
    assert message.startswith("c.yml:") and f": {key}" in message
    assert f"expected a duration of at least {floor}" in message, message
