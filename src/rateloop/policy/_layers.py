"""Layers: one raw source of policy values (a file, the environment, a dict), not yet merged.

Loaders only read and parse; validation happens when layers are merged
(:func:`rateloop.policy.Policy.layered`), so every error of every layer is
reported together.  A syntax error is reported at once, naming the file and
line.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path as FilePath
from types import MappingProxyType
from typing import Any

import yaml

from rateloop.errors import ConfigError
from rateloop.policy._schema import SCHEMA, Leaf, default_leaves

__all__ = ["ENV_IGNORED", "Layer"]

#: ``RATELOOP_*`` keys read by other parts of rateloop, which :meth:`Layer.from_env` skips.
#: The first five are the ``rateloop run`` agent runner's own lenient knobs.
ENV_IGNORED: frozenset[str] = frozenset(
    {
        "MAX_RETRIES",
        "BASE_DELAY_SECS",
        "MAX_DELAY_SECS",
        "FALLBACK_AUTO_MODEL",
        "MAX_STEP_OUTPUT_BYTES",
        "REQUIRE_SERVICES",
    }
)
#: Key prefixes (after ``RATELOOP_``) that belong to the test suite, also skipped.
ENV_IGNORED_PREFIXES: tuple[str, ...] = ("TEST_",)

_TOML_LINE = re.compile(r"at line (\d+)")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _read(path: FilePath) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read the policy file: {exc.strerror or exc}", source=str(path)
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the policy file is not UTF-8: {exc}", source=str(path)) from None


def _parse_toml(path: FilePath) -> dict[str, Any]:
    try:
        return tomllib.loads(_read(path))
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        line = f" at line {found.group(1)}" if found else ""
        raise ConfigError(f"invalid TOML{line}: {exc}", source=str(path)) from None


def _env_value(spec: Leaf, text: str) -> Any:
    """Parse an environment string by the leaf's kind; leave garbage for validation to report."""
    stripped = text.strip()
    if spec.optional and stripped.lower() in ("", "none"):
        return None
    try:
        if spec.kind == "int":
            return int(stripped)
        if spec.kind == "float":
            return float(stripped)
    except ValueError:
        return text
    if spec.kind == "bool":
        lowered = stripped.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        return text
    if spec.kind in ("strs", "rungs"):
        return [p.strip() for p in stripped.split(",") if p.strip()]
    return stripped


def _env_names() -> dict[str, tuple[str, str]]:
    """Environment name (after the prefix) → (table, key) for every leaf env can set."""
    names: dict[str, tuple[str, str]] = {}
    for table, leaves in SCHEMA.items():
        for key, spec in leaves.items():
            if spec.kind == "routes":
                continue
            names[(f"{table}__{key}" if table else key).upper()] = (table, key)
    return names


@dataclass(frozen=True, slots=True)
class Layer:
    """One source of raw policy values: ``source`` names it in errors and provenance."""

    source: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"Layer source must be a non-empty string, got {self.source!r}")
        if isinstance(self.data, Mapping) and not isinstance(self.data, MappingProxyType):
            object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    @classmethod
    def defaults(cls) -> Layer:
        """Every default value, as a layer named ``defaults``."""
        data: dict[str, Any] = {}
        for path, value in default_leaves().items():
            if len(path) == 1:
                data[path[0]] = value
            else:
                data.setdefault(path[0], {})[path[1]] = (
                    list(value) if isinstance(value, tuple) else value
                )
        return cls("defaults", data)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Layer:
        """A whole TOML file is the policy."""
        p = FilePath(path)
        return cls(str(p), _parse_toml(p))

    @classmethod
    def from_pyproject(cls, path: str | os.PathLike[str] = "pyproject.toml") -> Layer:
        """The ``[tool.rateloop]`` table of a pyproject.toml (empty when absent)."""
        p = FilePath(path)
        tool = _parse_toml(p).get("tool", {})
        data = tool.get("rateloop", {}) if isinstance(tool, Mapping) else {}
        return cls(f"{p} [tool.rateloop]", data)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Layer:
        """A YAML file (safe loader); an empty file is an empty layer."""
        p = FilePath(path)
        try:
            data = yaml.safe_load(_read(p))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(f"invalid YAML{line}: {problem}", source=str(p)) from None
        return cls(str(p), {} if data is None else data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Layer:
        """By name: ``pyproject.toml`` → [tool.rateloop], ``*.toml``, ``*.yaml``/``*.yml``."""
        p = FilePath(path)
        if p.name == "pyproject.toml":
            return cls.from_pyproject(p)
        suffix = p.suffix.lower()
        if suffix == ".toml":
            return cls.from_toml(p)
        if suffix in (".yaml", ".yml"):
            return cls.from_yaml(p)
        raise ConfigError(
            f"unsupported policy file type {p.suffix or '(none)'!r}",
            source=str(p),
            value=str(p),
            allowed="a .toml, .yaml or .yml file, or pyproject.toml",
        )

    @classmethod
    def from_env(cls, prefix: str = "RATELOOP_", environ: Mapping[str, str] | None = None) -> Layer:
        """``RATELOOP_MAX_ATTEMPTS=5``; tables with a double underscore:
        ``RATELOOP_BACKOFF__MAX_DELAY_SECS=30``.

        Values are parsed by the key's type (numbers, ``true``/``false``,
        comma-separated lists, ``none`` for unset) and validated strictly
        like a file.  An unknown ``RATELOOP_`` key is an error with a hint,
        except the keys in :data:`ENV_IGNORED` that other parts of rateloop
        read.  ``fallback.routes`` and ``[limits]`` are set in files only.
        """
        env = os.environ if environ is None else environ
        names = _env_names()
        data: dict[str, Any] = {}
        errors: list[ConfigError] = []
        for key in sorted(env):
            if not key.startswith(prefix):
                continue
            name = key[len(prefix) :]
            if name in ENV_IGNORED or name.startswith(ENV_IGNORED_PREFIXES):
                continue
            if name not in names:
                hint = get_close_matches(name, list(names), n=1)
                did = f"; did you mean {prefix}{hint[0]}?" if hint else ""
                errors.append(
                    ConfigError(
                        f"unknown environment key {key}{did}",
                        source="env",
                        key=key,
                        value=env[key],
                        allowed=", ".join(prefix + n for n in names),
                    )
                )
                continue
            table, leaf = names[name]
            value = _env_value(SCHEMA[table][leaf], env[key])
            if table:
                data.setdefault(table, {})[leaf] = value
            else:
                data[leaf] = value
        if errors:
            raise ConfigError.many(errors)
        return cls("env", data)

    def __repr__(self) -> str:
        return f"Layer({self.source!r}, keys={sorted(self.data)})"
