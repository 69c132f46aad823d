"""The YAML config: schema, defaults and validation with errors that name the file, line and key.

Each section is a frozen dataclass whose fields carry their default and their converter (`setting`), so a
default is declared once and one generic reader (`reader.Reader.struct`) reads every section. The collectors'
sections are handed in (`parse(text, sections)`): this package imports nothing above the engines.
The exporter runs without any file: `Config()` is the default (auto-discovery of known engines).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import yaml

from stallwatch.config.reader import Reader, compose, read_text, setting
from stallwatch.config.units import parse_size
from stallwatch.config.values import (
    LOOP_INTERVAL,
    absolute_path,
    boolean,
    choice,
    command_regex,
    count,
    duration_at_least,
    gpu_index,
    log_path,
    log_regex,
    pd_group,
    positive_duration,
    string,
    url,
    user_id,
)
from stallwatch.engines import ENGINES
from stallwatch.engines.base import EVENTS, PD_ROLES, PHASES, Rule

S = TypeVar("S", bound="CollectorSettings")


@dataclass(frozen=True)
class Paths:
    """Where the node's files are, as node_exporter's `--path.procfs`/`--path.rootfs`: a containerized
    exporter sees the node's root under e.g. `/host`. The log roots are node paths, read under `rootfs`."""

    procfs: str = setting(absolute_path, "/proc")
    rootfs: str = setting(absolute_path, "/")
    pod_logs: str = setting(absolute_path, "/var/log/pods")  # kubelet podLogsDir
    container_logs: str = setting(absolute_path, "/var/log/containers")  # kubelet's legacy links
    docker: str = setting(absolute_path, "/var/lib/docker")  # dockerd data-root
    journal: str | None = setting(absolute_path, None)  # a journal directory (`journalctl -D`); None: the system's
    kmsg: str = setting(absolute_path, "/dev/kmsg")  # the kernel log, for the driver's Xid lines; not under rootfs


@dataclass(frozen=True)
class ProbeTiming:
    timeout: float = setting(positive_duration, 5.0)
    interval: float = setting(LOOP_INTERVAL, 15.0)


@dataclass(frozen=True)
class Probe(ProbeTiming):
    url: str = setting(url, "")


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
    interval: float = setting(LOOP_INTERVAL, 10.0)
    # How long a discovered server whose process is gone stays (server_up 0 can still alert) before its
    # threads and series are dropped; a configured server is never dropped.
    forget_after: float = setting(positive_duration, 3600.0)
    # Discovered servers running and watched at once, in all and per tenant (`per_user`: its pod, container or unit,
    # a host process's uid; `watcher.tenant`): each costs threads, a tree walk per scrape and socket-table reads, and
    # any user can start processes with an engine's argv. A gone server holds no slot.
    max_servers: int = setting(count, 64)
    max_servers_per_user: int = setting(count, 32)


@dataclass(frozen=True)
class Web:
    """The status pages at `/servers/<name>`."""

    # Log lines and Python stacks can hold prompts and other users' data: shown over HTTP only when asked for.
    show_evidence: bool = setting(boolean, False)
    # Between the samples the hour's plots are drawn from; the ring holds an hour of them per server.
    history_interval: float = setting(duration_at_least(0.5), 10.0)


@dataclass(frozen=True)
class CollectorSettings:
    """A collector's config section; a collector with more keys subclasses it."""

    enabled: bool = setting(boolean, True)
    # Its detail families (catalog `detail`: read by no shipped rule or panel) and its duration: off by default,
    # as node_exporter keeps its costly collectors off, so that a node stays within its series budget.
    details: bool = setting(boolean, False)


@dataclass(frozen=True)
class ServerSpec:
    engine: str
    name: str | None = None  # None: `<engine>-<port>` once the process is found
    cmdline: re.Pattern[str] | None = None  # None: the engine's own matcher
    # Whose process it may be (`match.user`, a uid); None: the first match's to hold GPU memory (`discovery.watcher`).
    user: int | None = None
    logs: tuple[str, ...] = ()  # empty: the main process's stdout/stderr files
    probes: tuple[Probe, ...] | None = None  # None: the engine's health URL from --host/--port
    gpus: tuple[int, ...] | None = None  # None: auto, from NVML's process list
    stall: Stall = Stall()
    rules: tuple[Rule, ...] = ()  # extra log patterns, ahead of the engine's
    # The prefill/decode disaggregated group the server is a member of (`discovery.pd`); None: as found.
    pd_group: str | None = None
    pd_role: str | None = None  # prefill | decode; None: from its command line or a router's lists


@dataclass(frozen=True)
class Config:
    servers: tuple[ServerSpec, ...] = ()
    discovery: Discovery = Discovery()
    defaults: Defaults = Defaults()
    paths: Paths = Paths()
    web: Web = Web()
    collectors: Mapping[str, CollectorSettings] = field(default_factory=dict)  # by collector name
    # The collectors whose section in the file sets `enabled` (rather than leaving it to the default).
    enabled_in_file: frozenset[str] = frozenset()
    file: str = field(default="<defaults>", compare=False)

    def collector(self, name: str, settings: type[S]) -> S:
        """The section of collector `name`, or its defaults when the file has none."""
        found = self.collectors.get(name)
        return found if isinstance(found, settings) else settings()


def _patterns(r: Reader, node: yaml.Node, path: str) -> tuple[Rule, ...]:
    """`patterns: {<phase>: [regex...], events: {<event>: [regex...]}}`; a `launching` pattern is the server's
    launch banner (a line it prints once per launch)."""
    keys = r.mapping(node, path, {*PHASES, "events"})
    rules: list[Rule] = []
    for key, value_node in keys.items():
        if key == "events":
            for event, list_node in r.mapping(value_node, f"{path}.events", set(EVENTS)).items():
                rules += _rule_list(r, list_node, f"{path}.events.{event}", event=event)
        else:
            rules += _rule_list(r, value_node, f"{path}.{key}", phase=key, launch=key == "launching")
    return tuple(rules)


def _rule_list(r: Reader, node: yaml.Node, path: str, **meaning: str | bool) -> list[Rule]:
    patterns = r.items(node, path, lambda n, p: r.scalar(n, p, log_regex))
    return [Rule(pattern, **meaning) for pattern in patterns]


def _server(r: Reader, node: yaml.Node, path: str, defaults: Defaults) -> ServerSpec:
    keys = r.mapping(node, path, {"name", "engine", "match", "logs", "probes", "gpus", "stall", "patterns",
                                  "pd_group", "pd_role"})
    if "engine" not in keys:
        raise r.fail(node, f"{path}.engine", "missing; expected one of " + ", ".join(ENGINES))
    engine = r.scalar(keys["engine"], f"{path}.engine", choice(tuple(ENGINES)))
    cmdline = user = None
    if "match" in keys:
        match = r.mapping(keys["match"], f"{path}.match", {"cmdline", "user"})
        if "cmdline" in match:
            cmdline = r.scalar(match["cmdline"], f"{path}.match.cmdline", command_regex)
        if "user" in match:
            user = r.scalar(match["user"], f"{path}.match.user", user_id)
    if cmdline is None and ENGINES[engine].program is None:
        raise r.fail(node, f"{path}.match.cmdline", f"required for engine {engine!r}")
    probe = Probe(**dataclasses.asdict(defaults.probe))
    gpus = None
    if "gpus" in keys and not isinstance(keys["gpus"], yaml.ScalarNode):
        gpus = r.items(keys["gpus"], f"{path}.gpus", lambda n, p: r.scalar(n, p, gpu_index))
    elif "gpus" in keys:
        r.scalar(keys["gpus"], f"{path}.gpus", choice(("auto",)))
    return ServerSpec(
        engine=engine,
        name=r.scalar(keys["name"], f"{path}.name", string) if "name" in keys else None,
        cmdline=cmdline,
        user=user,
        logs=r.items(keys["logs"], f"{path}.logs", lambda n, p: r.scalar(n, p, log_path)) if "logs" in keys else (),
        probes=r.items(keys["probes"], f"{path}.probes", lambda n, p: r.struct(n, p, probe, required=("url",)))
        if "probes" in keys
        else None,
        gpus=gpus,
        stall=r.struct(keys.get("stall"), f"{path}.stall", defaults.stall),
        rules=_patterns(r, keys["patterns"], f"{path}.patterns") if "patterns" in keys else (),
        pd_group=r.scalar(keys["pd_group"], f"{path}.pd_group", pd_group) if "pd_group" in keys else None,
        pd_role=r.scalar(keys["pd_role"], f"{path}.pd_role", choice(PD_ROLES)) if "pd_role" in keys else None,
    )


def parse(text: str, sections: Mapping[str, type[CollectorSettings]], file: str = "<config>") -> Config:
    """The config in `text`; `sections` maps each collector's name to its settings class (the CLI hands in
    the registered collectors', so that this package needs none of them)."""
    r = Reader(file)
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
        enabled_in_file=frozenset(name for name in sections if _sets(keys.get(name), "enabled")),
        file=file,
    )


def _sets(node: yaml.Node | None, key: str) -> bool:
    """Whether a section (a mapping the reader accepted, or absent) has `key`."""
    return isinstance(node, yaml.MappingNode) and any(k.value == key for k, _ in node.value)


def load(path: str, sections: Mapping[str, type[CollectorSettings]]) -> Config:
    return parse(read_text(path, "config file"), sections, file=path)
