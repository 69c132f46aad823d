"""The YAML config: schema, defaults and validation with errors that name the file, line and key.

The exporter runs without any file: `Config()` is the default (auto-discovery of known engines).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import yaml

from stallwatch.engines import ENGINES, EVENTS, PHASES, Rule, rule
from stallwatch.units import parse_duration, parse_size

T = TypeVar("T")


class ConfigError(Exception):
    """A config that cannot be used; the message names file, line, key and the reason."""


@dataclass(frozen=True)
class Probe:
    url: str
    timeout: float = 5.0
    interval: float = 15.0


@dataclass(frozen=True)
class Stall:
    gpu_memory_bytes: float = 1e9
    log_stale: float = 600.0


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
    discovery: bool = True
    discovery_interval: float = 10.0
    default_stall: Stall = Stall()
    default_probe_timeout: float = 5.0
    default_probe_interval: float = 15.0
    gpu_enabled: bool = True
    gpu_sample_interval: float = 1.0
    process_enabled: bool = True
    probe_enabled: bool = True
    logs_enabled: bool = True
    logs_poll_interval: float = 1.0
    source: str = field(default="<defaults>", compare=False)


class _Reader:
    """Walks the composed YAML node tree so that every error can point at a line."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, node: yaml.Node | None, path: str, reason: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(f"{self.source}{line}: {path}: {reason}")

    def mapping(self, node: yaml.Node, path: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, f"expected a mapping, got {_kind(node)}")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            key_path = f"{path}.{key}" if path else key
            if not isinstance(key_node, yaml.ScalarNode) or key not in allowed:
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
        value = yaml.safe_load(yaml.serialize(node))
        try:
            return convert(value)
        except (ValueError, TypeError, re.error) as exc:
            raise self.fail(node, path, str(exc)) from None


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value!r}"


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _regex(value: Any) -> re.Pattern[str]:
    text = _string(value)
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"invalid regular expression {text!r}: {exc}") from None


def _positive_duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"expected a duration above zero, got {value!r}")
    return seconds


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return value

    return convert


def _gpu_index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a GPU index (0, 1, ...), got {value!r}")
    return value


def _url(value: Any) -> str:
    text = _string(value)
    if not re.match(r"https?://[^/\s]+", text):
        raise ValueError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def _enabled(r: _Reader, node: yaml.Node | None, path: str, default: bool, **extra: Any) -> dict[str, Any]:
    """A `{enabled: bool, ...}` section; extra maps optional keys to converters."""
    if node is None:
        return {"enabled": default}
    keys = r.mapping(node, path, {"enabled", *extra})
    out: dict[str, Any] = {"enabled": default}
    for key, value_node in keys.items():
        convert = _boolean if key == "enabled" else extra[key]
        out[key] = r.scalar(value_node, f"{path}.{key}", convert)
    return out


def _stall(r: _Reader, node: yaml.Node | None, path: str, default: Stall) -> Stall:
    if node is None:
        return default
    keys = r.mapping(node, path, {"gpu_memory_bytes", "log_stale"})
    return Stall(
        gpu_memory_bytes=r.scalar(keys["gpu_memory_bytes"], f"{path}.gpu_memory_bytes", parse_size)
        if "gpu_memory_bytes" in keys
        else default.gpu_memory_bytes,
        log_stale=r.scalar(keys["log_stale"], f"{path}.log_stale", _positive_duration)
        if "log_stale" in keys
        else default.log_stale,
    )


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


def _rule_list(r: _Reader, node: yaml.Node, path: str, **meaning: str) -> list[Rule]:
    return [
        rule(r.scalar(item, f"{path}[{i}]", _regex).pattern, **meaning)
        for i, item in enumerate(r.sequence(node, path))
    ]


def _server(r: _Reader, node: yaml.Node, path: str, config: dict[str, Any]) -> ServerSpec:
    keys = r.mapping(node, path, {"name", "engine", "match", "logs", "probes", "gpus", "stall", "patterns"})
    if "engine" not in keys:
        raise r.fail(node, f"{path}.engine", "missing; expected one of " + ", ".join(ENGINES))
    engine = r.scalar(keys["engine"], f"{path}.engine", _choice(tuple(ENGINES)))
    cmdline = None
    if "match" in keys:
        match = r.mapping(keys["match"], f"{path}.match", {"cmdline"})
        if "cmdline" in match:
            cmdline = r.scalar(match["cmdline"], f"{path}.match.cmdline", _regex)
    if cmdline is None and ENGINES[engine].cmdline is None:
        raise r.fail(node, f"{path}.match.cmdline", f"required for engine {engine!r}")
    probes = None
    if "probes" in keys:
        probes = tuple(
            _probe(r, item, f"{path}.probes[{i}]", config)
            for i, item in enumerate(r.sequence(keys["probes"], f"{path}.probes"))
        )
    gpus = None
    if "gpus" in keys:
        gpus_node = keys["gpus"]
        if isinstance(gpus_node, yaml.ScalarNode):
            r.scalar(gpus_node, f"{path}.gpus", _choice(("auto",)))
        else:
            gpus = tuple(
                r.scalar(item, f"{path}.gpus[{i}]", _gpu_index)
                for i, item in enumerate(r.sequence(gpus_node, f"{path}.gpus"))
            )
    return ServerSpec(
        engine=engine,
        name=r.scalar(keys["name"], f"{path}.name", _string) if "name" in keys else None,
        cmdline=cmdline,
        logs=tuple(
            r.scalar(item, f"{path}.logs[{i}]", _string)
            for i, item in enumerate(r.sequence(keys["logs"], f"{path}.logs"))
        )
        if "logs" in keys
        else (),
        probes=probes,
        gpus=gpus,
        stall=_stall(r, keys.get("stall"), f"{path}.stall", config["default_stall"]),
        rules=_patterns(r, keys["patterns"], f"{path}.patterns") if "patterns" in keys else (),
    )


def _probe(r: _Reader, node: yaml.Node, path: str, config: dict[str, Any]) -> Probe:
    keys = r.mapping(node, path, {"url", "timeout", "interval"})
    if "url" not in keys:
        raise r.fail(node, f"{path}.url", "missing")
    return Probe(
        url=r.scalar(keys["url"], f"{path}.url", _url),
        timeout=r.scalar(keys["timeout"], f"{path}.timeout", _positive_duration)
        if "timeout" in keys
        else config["default_probe_timeout"],
        interval=r.scalar(keys["interval"], f"{path}.interval", _positive_duration)
        if "interval" in keys
        else config["default_probe_interval"],
    )


def parse(text: str, source: str = "<config>") -> Config:
    r = _Reader(source)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{line}: invalid YAML: {problem}") from None
    if root is None:
        return Config(source=source)
    keys = r.mapping(root, "", {"servers", "discovery", "defaults", "gpu", "process", "probe", "logs"})
    config: dict[str, Any] = {"source": source}

    if "defaults" in keys:
        defaults = r.mapping(keys["defaults"], "defaults", {"stall", "probe"})
        config["default_stall"] = _stall(r, defaults.get("stall"), "defaults.stall", Stall())
        if "probe" in defaults:
            probe = r.mapping(defaults["probe"], "defaults.probe", {"timeout", "interval"})
            for key in probe:
                config[f"default_probe_{key}"] = r.scalar(probe[key], f"defaults.probe.{key}", _positive_duration)
    config.setdefault("default_stall", Stall())
    config.setdefault("default_probe_timeout", Config.default_probe_timeout)
    config.setdefault("default_probe_interval", Config.default_probe_interval)

    servers: list[ServerSpec] = []
    if "servers" in keys:
        names: dict[str, int] = {}
        for i, item in enumerate(r.sequence(keys["servers"], "servers")):
            spec = _server(r, item, f"servers[{i}]", config)
            if spec.name is not None:
                if spec.name in names:
                    raise r.fail(item, f"servers[{i}].name", f"duplicate server name {spec.name!r} "
                                 f"(also servers[{names[spec.name]}])")
                names[spec.name] = i
            servers.append(spec)
    config["servers"] = tuple(servers)

    discovery = _enabled(r, keys.get("discovery"), "discovery", not servers, interval=_positive_duration)
    config["discovery"] = discovery["enabled"]
    if "interval" in discovery:
        config["discovery_interval"] = discovery["interval"]
    gpu = _enabled(r, keys.get("gpu"), "gpu", True, sample_interval=_positive_duration)
    config["gpu_enabled"] = gpu["enabled"]
    if "sample_interval" in gpu:
        config["gpu_sample_interval"] = gpu["sample_interval"]
    config["process_enabled"] = _enabled(r, keys.get("process"), "process", True)["enabled"]
    config["probe_enabled"] = _enabled(r, keys.get("probe"), "probe", True)["enabled"]
    logs = _enabled(r, keys.get("logs"), "logs", True, poll_interval=_positive_duration)
    config["logs_enabled"] = logs["enabled"]
    if "poll_interval" in logs:
        config["logs_poll_interval"] = logs["poll_interval"]
    return Config(**config)


def load(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from None
    return parse(text, source=path)
