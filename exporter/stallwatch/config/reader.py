"""The bounded, line-numbered YAML reader behind every config file (`--config.file`, `--web.config.file`).

A file is read only when it is a regular file of at most MAX_FILE_BYTES, composed by PyYAML's safe composer
without explicit tags and at most MAX_DEPTH deep, and walked node by node (`Reader`) so that every error names the
file, the line and the key. Sections are frozen dataclasses whose fields carry their default and converter
(`setting`); `Reader.struct` reads any of them, as blackbox_exporter's one unmarshal per struct does
(`config/config.go`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import typing
from collections.abc import Callable
from dataclasses import field
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

MAX_FILE_BYTES = 1 << 20  # a config is a few KiB; a big one would take minutes and GiBs through PyYAML
MAX_DEPTH = 16  # the schema nests 5 deep; deeper is a mistake, and PyYAML's composer recurses per level
# The tags the safe loader resolves implicitly; explicit others (`!foo`, `!!binary`, `!!python/...`) are refused.
_CORE_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in (
    "str", "int", "float", "bool", "null", "timestamp", "merge", "value", "map", "seq"))


class ConfigError(Exception):
    """A config that cannot be used; the message names file, line, key and the reason."""


def setting(convert: Callable[[Any], Any], default: Any) -> Any:
    """A config field: its default and the converter that checks a YAML value for it."""
    return field(default=default, metadata={"convert": convert})


class Reader:
    """Walks the composed YAML node tree so that every error can point at a line."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, node: yaml.Node | None, path: str, reason: str) -> ConfigError:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return ConfigError(f"{self.file}{line}: {path}: {reason}")

    def mapping(self, node: yaml.Node, path: str, allowed: set[str]) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, f"expected a mapping, got {kind(node)}")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else f"<{kind(key_node)}>"
            key_path = f"{path}.{key}" if path else key
            if key not in allowed:
                raise self.fail(key_node, key_path, f"unknown key; expected one of {', '.join(sorted(allowed))}")
            if key in out:
                raise self.fail(key_node, key_path, "duplicate key")
            out[key] = value_node
        return out

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, path, f"expected a list, got {kind(node)}")
        return list(node.value)

    def scalar(self, node: yaml.Node, path: str, convert: Callable[[Any], T]) -> T:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, path, f"expected a single value, got {kind(node)}")
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

    def items(self, node: yaml.Node, path: str, read: Callable[[yaml.Node, str], T]) -> tuple[T, ...]:
        """A list, each item read by `read(node, path)`."""
        return tuple(read(item, f"{path}[{i}]") for i, item in enumerate(self.sequence(node, path)))


def kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value[:80]!r}"


def compose(r: Reader, text: str) -> yaml.Node | None:
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


def _check_tree(r: Reader, root: yaml.Node) -> None:
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
