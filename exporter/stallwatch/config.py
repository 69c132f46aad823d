"""The YAML config: schema, defaults and validation with errors that name the file, line and key.

Each section is a frozen dataclass whose fields carry their default and their converter (`setting`), so a
default is declared once and one generic reader (`_Reader.struct`) reads every section, as
blackbox_exporter's `Default<X>Probe` values with one unmarshal per struct do (`config/config.go`).
The exporter runs without any file: `Config()` is the default (auto-discovery of known engines).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from stallwatch.engines import ENGINES, EVENTS, PHASES, Rule
from stallwatch.units import parse_duration, parse_size

T = TypeVar("T")
S = TypeVar("S", bound="CollectorSettings")

MAX_FILE_BYTES = 1 << 20  # a config is a few KiB; a big one would take minutes and GiBs through PyYAML
MAX_DEPTH = 16  # the schema nests 5 deep; deeper is a mistake, and PyYAML's composer recurses per level
MAX_REGEX_CHARS = 4096
# The tags the safe loader resolves implicitly; explicit others (`!foo`, `!!binary`, `!!python/...`) are refused.
_CORE_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in (
    "str", "int", "float", "bool", "null", "timestamp", "merge", "value", "map", "seq"))


class ConfigError(Exception):
    """A config that cannot be used; the message names file, line, key and the reason."""


def setting(convert: Callable[[Any], Any], default: Any) -> Any:
    """A config field: its default and the converter that checks a YAML value for it."""
    return field(default=default, metadata={"convert": convert})


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    try:
        value.encode("utf-8")  # a `"\ud800"` escape gives a lone surrogate, which no label or path can carry
    except UnicodeEncodeError:
        raise ValueError(f"expected valid Unicode text, got {value!r}") from None
    return value


def _log_path(value: Any) -> str:
    text = _string(value)
    if "\0" in text:  # the OS refuses it at every open, which would stop every server's logs
        raise ValueError(f"expected a path without NUL bytes, got {text!r}")
    return text


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration above zero, got {value!r}")
    return seconds


def _url(value: Any) -> str:
    text = _string(value)
    if not re.match(r"https?://[^/\s]+", text):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    port = urlsplit(text).port  # raises ValueError for a port that is not 0-65535: refused here, not in a probe
    if port == 0 or not text.isascii():
        raise ValueError(f"expected an ASCII URL with a port from 1 to 65535, got {text!r}")
    return text


def _absolute_path(value: Any) -> str:
    text = _string(value)
    if not text.startswith("/") or "\0" in text:
        raise ValueError(f"expected an absolute path, got {text!r}")
    return text


@dataclass(frozen=True)
class Paths:
    """Where the node's files are, as node_exporter's `--path.procfs`/`--path.rootfs`: a containerized
    exporter sees the node's root under e.g. `/host`. The log roots are node paths, read under `rootfs`."""

    procfs: str = setting(_absolute_path, "/proc")
    rootfs: str = setting(_absolute_path, "/")
    pod_logs: str = setting(_absolute_path, "/var/log/pods")  # kubelet podLogsDir
    container_logs: str = setting(_absolute_path, "/var/log/containers")  # kubelet's legacy links
    docker: str = setting(_absolute_path, "/var/lib/docker")  # dockerd data-root
    journal: str | None = setting(_absolute_path, None)  # a journal directory (`journalctl -D`); None: the system's


@dataclass(frozen=True)
class ProbeTiming:
    timeout: float = setting(positive_duration, 5.0)
    interval: float = setting(positive_duration, 15.0)


@dataclass(frozen=True)
class Probe(ProbeTiming):
    url: str = setting(_url, "")


@dataclass(frozen=True)
class Stall:
    gpu_memory_bytes: float = setting(parse_size, 1e9)
    log_stale: float = setting(positive_duration, 600.0)


@dataclass(frozen=True)
class Defaults:
    """What every server gets unless its own entry says otherwise."""

    stall: Stall = Stall()
    probe: ProbeTiming = ProbeTiming()


@dataclass(frozen=True)
class Discovery:
    enabled: bool = setting(boolean, True)  # default: on when no servers are listed
    interval: float = setting(positive_duration, 10.0)
    # How long a discovered server whose process is gone stays (server_up 0 can still alert) before its
    # threads and series are dropped; a configured server is never dropped.
    forget_after: float = setting(positive_duration, 3600.0)


@dataclass(frozen=True)
class Web:
    """The status pages at `/servers/<name>`."""

    # Log lines and Python stacks can hold prompts and other users' data: shown over HTTP only when asked for.
    show_evidence: bool = setting(boolean, False)
    history_interval: float = setting(positive_duration, 10.0)  # between the samples the hour's plots are drawn from


@dataclass(frozen=True)
class CollectorSettings:
    """A collector's config section; a collector with more keys subclasses it."""

    enabled: bool = setting(boolean, True)


@dataclass(frozen=True)
class ServerSpec:
    engine: str
    name: str | None = None  # None: `<engine>-<port>` once the process is found
    cmdline: re.Pattern[str] | None = None  # None: the engine's own matcher
    logs: tuple[str, ...] = ()  # empty: the main process's stdout/stderr files
    probes: tuple[Probe, ...] | None = None  # None: the engine's health URL from --host/--port
    gpus: tuple[int, ...] | None = None  # None: auto, from NVML's process list
    stall: Stall = Stall()
    rules: tuple[Rule, ...] = ()  # extra log patterns, ahead of the engine's


@dataclass(frozen=True)
class Config:
    servers: tuple[ServerSpec, ...] = ()
    discovery: Discovery = Discovery()
    defaults: Defaults = Defaults()
    paths: Paths = Paths()
    web: Web = Web()
    collectors: Mapping[str, CollectorSettings] = field(default_factory=dict)  # by collector name
    file: str = field(default="<defaults>", compare=False)

    def collector(self, name: str, settings: type[S]) -> S:
        """The section of collector `name`, or its defaults when the file has none."""
        found = self.collectors.get(name)
        return found if isinstance(found, settings) else settings()


class _Reader:
    """Walks the composed YAML node tree so that every error can point at a line."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, node: yaml.Node | None, path: str, reason: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(f"{self.file}{line}: {path}: {reason}")

    def mapping(self, node: yaml.Node, path: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, f"expected a mapping, got {_kind(node)}")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else f"<{_kind(key_node)}>"
            key_path = f"{path}.{key}" if path else key
            if key not in allowed:
                raise self.fail(key_node, key_path, f"unknown key; expected one of {', '.join(sorted(allowed))}")
            if key in out:
                raise self.fail(key_node, key_path, "duplicate key")
            out[key] = value_node
        return out

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, path, f"expected a list, got {_kind(node)}")
        return list(node.value)

    def scalar(self, node: yaml.Node, path: str, convert: Callable[[Any], T]) -> T:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, path, f"expected a single value, got {_kind(node)}")
        try:
            return convert(yaml.safe_load(yaml.serialize(node)))
        except (ValueError, TypeError, re.error, yaml.YAMLError) as exc:  # YAML: a bad timestamp or base64
            raise self.fail(node, path, str(exc)) from None

    def struct(self, node: yaml.Node | None, path: str, base: T, required: tuple[str, ...] = ()) -> T:
        """A section read into a copy of `base`: keys are its fields, absent keys keep `base`'s values."""
        if node is None:
            return base
        hints = typing.get_type_hints(type(base))
        fields = {f.name: f for f in dataclasses.fields(base)}  # type: ignore[arg-type]
        keys = self.mapping(node, path, set(fields))
        for name in required:
            if name not in keys:
                raise self.fail(node, f"{path}.{name}", "missing")
        values: dict[str, Any] = {}
        for key, value_node in keys.items():
            if dataclasses.is_dataclass(hints[key]):
                values[key] = self.struct(value_node, f"{path}.{key}", getattr(base, key))
            else:
                values[key] = self.scalar(value_node, f"{path}.{key}", fields[key].metadata["convert"])
        return dataclasses.replace(base, **values)  # type: ignore[type-var]


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value[:80]!r}"


def compose(r: _Reader, text: str) -> yaml.Node | None:
    """The YAML node tree of a config file's text, within the size and depth limits and without tags; a
    ConfigError naming the line otherwise."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(f"{r.file}: larger than {MAX_FILE_BYTES} bytes")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{r.file}{line}: invalid YAML: {problem}") from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ConfigError(f"{r.file}: nested deeper than {MAX_DEPTH} levels") from None
    if root is not None:
        _check_tree(r, root)
    return root


def _check_tree(r: _Reader, root: yaml.Node) -> None:
    """Refuse what the schema never needs and PyYAML would choke on later: explicit tags (`!foo`,
    `!!python/...`, `!!binary`) and nesting deeper than MAX_DEPTH. Iterative, and each node once: an alias
    shares its node, so a billion-laughs file stays as cheap as its size."""
    seen: set[int] = set()
    stack = [(root, 0, "")]
    while stack:
        node, depth, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.tag not in _CORE_TAGS:
            raise r.fail(node, path or "<root>", f"unsupported tag {node.tag[:80]!r}")
        if depth > MAX_DEPTH:
            raise r.fail(node, path or "<root>", f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.SequenceNode):
            stack += [(item, depth + 1, f"{path}[{i}]") for i, item in enumerate(node.value)]
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else "<key>"
                stack += [(key, depth + 1, path), (value, depth + 1, f"{path}.{name}" if path else name)]


def _compiled(text: str, pattern: str | bytes) -> re.Pattern[Any]:
    if len(text) > MAX_REGEX_CHARS:
        raise ValueError(f"regular expression longer than {MAX_REGEX_CHARS} characters")
    try:
        return re.compile(pattern, re.MULTILINE if isinstance(pattern, bytes) else 0)
    # OverflowError: a repeat count too big; RecursionError: thousands of nested groups.
    except (re.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"invalid regular expression {text[:80]!r}: {exc}") from None


def _regex(value: Any) -> re.Pattern[str]:
    """A pattern on command lines (text)."""
    text = _string(value)
    return _compiled(text, text)


def _log_regex(value: Any) -> re.Pattern[bytes]:
    """A pattern on log lines, which are bytes: compiled as the engines' rules are, so `(?u)` or `\\N{...}`,
    valid as text only, are refused here rather than failing later."""
    text = _string(value)
    return _compiled(text, text.encode())


def choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return value

    return convert


def _gpu_index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a GPU index (0, 1, ...), got {value!r}")
    return value


def _patterns(r: _Reader, node: yaml.Node, path: str) -> tuple[Rule, ...]:
    """`patterns: {<phase>: [regex...], events: {<event>: [regex...]}}`"""
    keys = r.mapping(node, path, {*PHASES, "events"})
    rules: list[Rule] = []
    for key, value_node in keys.items():
        if key == "events":
            for event, list_node in r.mapping(value_node, f"{path}.events", set(EVENTS)).items():
                rules += _rule_list(r, list_node, f"{path}.events.{event}", event=event)
        else:
            rules += _rule_list(r, value_node, f"{path}.{key}", phase=key)
    return tuple(rules)


def _items(r: _Reader, node: yaml.Node, path: str, read: Callable[[yaml.Node, str], T]) -> tuple[T, ...]:
    return tuple(read(item, f"{path}[{i}]") for i, item in enumerate(r.sequence(node, path)))


def _rule_list(r: _Reader, node: yaml.Node, path: str, **meaning: str) -> list[Rule]:
    patterns = _items(r, node, path, lambda n, p: r.scalar(n, p, _log_regex))
    return [Rule(pattern, **meaning) for pattern in patterns]


def _server(r: _Reader, node: yaml.Node, path: str, defaults: Defaults) -> ServerSpec:
    keys = r.mapping(node, path, {"name", "engine", "match", "logs", "probes", "gpus", "stall", "patterns"})
    if "engine" not in keys:
        raise r.fail(node, f"{path}.engine", "missing; expected one of " + ", ".join(ENGINES))
    engine = r.scalar(keys["engine"], f"{path}.engine", choice(tuple(ENGINES)))
    cmdline = None
    if "match" in keys:
        match = r.mapping(keys["match"], f"{path}.match", {"cmdline"})
        if "cmdline" in match:
            cmdline = r.scalar(match["cmdline"], f"{path}.match.cmdline", _regex)
    if cmdline is None and ENGINES[engine].cmdline is None:
        raise r.fail(node, f"{path}.match.cmdline", f"required for engine {engine!r}")
    probe = Probe(**dataclasses.asdict(defaults.probe))
    gpus = None
    if "gpus" in keys and not isinstance(keys["gpus"], yaml.ScalarNode):
        gpus = _items(r, keys["gpus"], f"{path}.gpus", lambda n, p: r.scalar(n, p, _gpu_index))
    elif "gpus" in keys:
        r.scalar(keys["gpus"], f"{path}.gpus", choice(("auto",)))
    return ServerSpec(
        engine=engine,
        name=r.scalar(keys["name"], f"{path}.name", _string) if "name" in keys else None,
        cmdline=cmdline,
        logs=_items(r, keys["logs"], f"{path}.logs", lambda n, p: r.scalar(n, p, _log_path)) if "logs" in keys else (),
        probes=_items(r, keys["probes"], f"{path}.probes", lambda n, p: r.struct(n, p, probe, required=("url",)))
        if "probes" in keys
        else None,
        gpus=gpus,
        stall=r.struct(keys.get("stall"), f"{path}.stall", defaults.stall),
        rules=_patterns(r, keys["patterns"], f"{path}.patterns") if "patterns" in keys else (),
    )


def _collector_sections() -> dict[str, type[CollectorSettings]]:
    from stallwatch.collectors import REGISTRY  # the collectors import this module: resolve at call time

    return {registration.name: registration.settings for registration in REGISTRY}


def parse(text: str, file: str = "<config>", sections: Mapping[str, type[CollectorSettings]] | None = None) -> Config:
    """The config in `text`; `sections` maps each collector's name to its settings class (default: all)."""
    sections = _collector_sections() if sections is None else sections
    r = _Reader(file)
    root = compose(r, text)
    keys = {} if root is None else r.mapping(root, "", {"servers", "discovery", "defaults", "paths", "web", *sections})
    defaults = r.struct(keys.get("defaults"), "defaults", Defaults())

    servers: list[ServerSpec] = []
    names: dict[str, int] = {}
    for i, item in enumerate(r.sequence(keys["servers"], "servers") if "servers" in keys else []):
        spec = _server(r, item, f"servers[{i}]", defaults)
        if spec.name is not None and spec.name in names:
            raise r.fail(item, f"servers[{i}].name",
                         f"duplicate server name {spec.name!r} (also servers[{names[spec.name]}])")
        if spec.name is not None:
            names[spec.name] = i
        servers.append(spec)

    return Config(
        servers=tuple(servers),
        discovery=r.struct(keys.get("discovery"), "discovery", Discovery(enabled=not servers)),
        defaults=defaults,
        paths=r.struct(keys.get("paths"), "paths", Paths()),
        web=r.struct(keys.get("web"), "web", Web()),
        collectors={name: r.struct(keys.get(name), name, settings()) for name, settings in sections.items()},
        file=file,
    )


def load(path: str) -> Config:
    return parse(read_text(path, "config file"), file=path)


def read_text(path: str, what: str) -> str:
    """A config file's text, or a ConfigError naming `path` and why it cannot be read."""
    try:
        return _read_regular(path).decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from None


def _read_regular(path: str) -> bytes:
    """The file's bytes, at most MAX_FILE_BYTES of them. Opened non-blocking and checked to be a regular file
    before any read: a FIFO would block the exporter's start (or `check-config`) for good."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    return data
