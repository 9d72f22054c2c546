"""The policy file's schema: every key, its default and its bounds, in one table.

How it works.  A policy file is a tree of tables whose leaves are values.
:data:`SCHEMA` describes every leaf once (:class:`Leaf`: kind, default,
bounds, the sentence shown as "allowed").  :func:`check_layer` walks one
raw mapping (a file, the environment, a dict) against it and returns its
leaves flattened to *paths* (tuples such as ``("backoff", "max_delay_secs")``)
with normalized values, plus every error found; it never stops at the first.
Two subtrees are special: ``[limits."scope"]`` tables have free scope names
and are validated by :class:`~rateloop.admission.spec.LimitSpec`, and
``fallback.routes`` is a list of route tables, one leaf as a whole (lists
are replaced whole when layering).

Paths are written as TOML dotted keys; a segment that is not a bare word is
quoted: ``limits."openai:gpt-4.1".requests_per_minute``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from difflib import get_close_matches
from typing import Any

from rateloop.admission.spec import LimitSpec
from rateloop.errors import ConfigError
from rateloop.policy._checks import (
    LIMIT_ALIASES,
    limit_bound_problems,
    limit_kind_problems,
    scope_key_problem,
    shown,
)
from rateloop.policy._leaf import Invalid, Leaf, choice_leaf, num_leaf
from rateloop.policy._paths import Path, dotted, parse_path
from rateloop.route import TIERS, Route
from rateloop.signal import DEFAULT_PAUSE_LIMIT_SECS
from rateloop.timing.ladder import NO_BATCH_CLASSES, RUNGS

__all__ = [
    "SCHEMA",
    "TABLES",
    "Invalid",
    "Leaf",
    "Path",
    "check_layer",
    "check_lock_path",
    "cross_check",
    "default_leaves",
    "dotted",
    "parse_path",
]


# Every number has an upper bound: a value past it is a typo, and an unbounded one
# (2**1024) would load and then overflow at the first admission.
_MAX_SECS = 86_400.0
_MAX_MULTIPLIER = 100.0
_MAX_USD = 1_000_000.0
_MAX_BYTES = 10**12
_MAX_CONTEXT = 10**9
_num, _choice = num_leaf, choice_leaf

_SECS = " of seconds"

#: Every leaf of the policy file, by table ("" is the top level).
SCHEMA: Mapping[str, Mapping[str, Leaf]] = {
    "": {
        "max_attempts": _num("int", 20, 1, 1000),
        "recovery_budget_secs": _num("float", 600.0, 1, _MAX_SECS, _SECS),
        "pause_limit_secs": _num("float", DEFAULT_PAUSE_LIMIT_SECS, 1, _MAX_SECS, _SECS),
        "trigger_scope": _choice("transient", "rate-limit", "transient", "all"),
        "on_exhausted": _choice("fail", "fail", "soft"),
        "attempts_per_route": _num("int", None, 1, 1000, optional=True),
        "max_wait_secs": _num("float", None, 1, _MAX_SECS, _SECS, optional=True),
        "max_error_attempts": _num("int", None, 1, 1000, optional=True),
        "enabled": Leaf(kind="bool", default=True, allowed="true or false"),
    },
    "backoff": {
        "strategy": _choice("exponential", "exponential", "linear", "constant", "decorrelated"),
        "initial_delay_secs": _num("float", 5.0, 1, _MAX_SECS, _SECS),
        "max_delay_secs": _num("float", 60.0, 1, _MAX_SECS, _SECS),
        "multiplier": _num("float", 2.0, 1, _MAX_MULTIPLIER),
        "jitter": _choice("equal", "none", "equal", "full"),
    },
    "fallback": {
        "routes": Leaf(kind="routes", default=(), allowed="a list of route tables"),
        "allowed_providers": Leaf(
            kind="strs",
            default=None,
            optional=True,
            allowed="a list of provider names, or unset for any provider",
        ),
        "max_cost_usd": _num("float", None, 0, _MAX_USD, " of US dollars", optional=True),
        "data_class": Leaf(
            kind="str", default=None, optional=True, allowed="a data class tag, e.g. 'pii'"
        ),
    },
    "ladder": {
        **{
            cls: Leaf(
                kind="rungs",
                default=None,
                optional=True,
                choices=allowed,
                allowed=f"a list of rungs from {', '.join(allowed)}, walked in order, park last, "
                "or unset for the route and its fallbacks",
            )
            for cls in ("safety", "interactive", "scheduled", "background")
            for allowed in [tuple(r for r in RUNGS if r != "batch" or cls not in NO_BATCH_CLASSES)]
        },
        "deferrable": Leaf(
            kind="strs",
            default=("background",),
            choices=("safety", "interactive", "scheduled", "background"),
            allowed="a list of priority classes: safety, interactive, scheduled, background",
        ),
        "flex_discount": _num("float", 0.5, 0, 1),
        "batch_discount": _num("float", 0.5, 0, 1),
    },
    "agents": {
        "max_retries": _num("int", 5, 0, 100),
        "base_delay_secs": _num("float", 60.0, 0, _MAX_SECS, _SECS),
        "max_delay_secs": _num("float", 600.0, 0, _MAX_SECS, _SECS),
        "fallback_auto_model": Leaf(kind="bool", default=False, allowed="true or false"),
        "max_step_output_bytes": _num("int", 10_000_000, 1, _MAX_BYTES),
    },
    "admission": {
        "backend": Leaf(
            kind="url",
            default="memory://",
            allowed="a backend URL such as 'memory://' or 'redis://host:6379/0' "
            "(a port from 1 to 65535)",
        ),
        "on_unreachable": _choice("fail_closed", "fail_closed", "local"),
        "local_share": _num("float", 1.0, 0, 1, lo_open=True),
        "cold_start": _num("int", 8, 0, 10_000),
        "local_lease_secs": _num("float", None, 0, 60, _SECS, lo_open=True, optional=True),
    },
    "governance": {
        "locked": Leaf(
            kind="strs", default=(), allowed="a list of dot-paths, e.g. 'backoff.max_delay_secs'"
        ),
    },
}

#: The tables of a policy file, in the order they are printed.
TABLES: tuple[str, ...] = (
    "backoff", "fallback", "ladder", "limits", "agents", "admission", "governance"
)

_LIMIT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LimitSpec))
_ROUTE_FIELDS: Mapping[str, Leaf] = {
    "provider": Leaf(kind="str", default=None, allowed="a provider name without ':'"),
    "model": Leaf(kind="str", default=None, allowed="a model name without ':'"),
    "project": Leaf(kind="str", default=None, optional=True, allowed="a project id, or unset"),
    "tenant": Leaf(kind="str", default=None, optional=True, allowed="a tenant id, or unset"),
    "context_window": _num("int", None, 1, _MAX_CONTEXT, " of tokens", optional=True),
    "tags": Leaf(kind="strs", default=(), allowed="a list of data class tags, e.g. ['pii']"),
    "input_price_per_mtok": _num("float", None, 0, _MAX_USD, " of US dollars", optional=True),
    "output_price_per_mtok": _num("float", None, 0, _MAX_USD, " of US dollars", optional=True),
    "tier": _choice("standard", *TIERS),
}


def _hint(name: str, known: list[str]) -> str:
    found = get_close_matches(name, known, n=1)
    return f"; did you mean {found[0]!r}?" if found else ""


def _where_else(name: str, table: str) -> str:
    """A hint for a key that exists, but in another table."""
    for other, leaves in SCHEMA.items():
        if other != table and name in leaves:
            return f"; it belongs {f'in [{other}]' if other else 'at the top level'}"
    return ""


def check_lock_path(text: object) -> Path:
    """A lock path that names a known leaf or table; raises Invalid otherwise."""
    if not isinstance(text, str):
        raise Invalid
    try:
        path = parse_path(text)
    except ValueError:
        raise Invalid from None
    head, rest = path[0], path[1:]
    if not rest and (head in SCHEMA[""] or head in TABLES) and head != "governance":
        return path
    if head == "limits":
        if len(rest) == 1 or (len(rest) == 2 and rest[1] in _LIMIT_FIELDS):
            return path
        raise Invalid
    if (
        head in SCHEMA
        and head not in ("", "governance")
        and len(rest) == 1
        and rest[0] in SCHEMA[head]
    ):
        return path
    raise Invalid


class _Checker:
    """Collects the leaves and errors of one layer."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.leaves: dict[Path, Any] = {}
        self.errors: list[ConfigError] = []

    def error(self, path: Path, message: str, value: Any, allowed: str) -> None:
        self.errors.append(
            ConfigError(message, source=self.source, key=dotted(path), value=value, allowed=allowed)
        )

    def invalid(self, path: Path, value: Any, allowed: str) -> None:
        self.error(path, f"invalid value {shown(value)}", value, allowed)

    def unknown(self, path: Path, known: list[str], value: Any, table: str) -> None:
        name = str(path[-1])
        if not name:
            # "" = {...} would otherwise read as the top level (SCHEMA's key for it).
            self.error(path, "empty key: a key needs a name", value, ", ".join(known))
            return
        alias = LIMIT_ALIASES.get(name.lower()) if table == "limits" else None
        hint = f"; did you mean {alias!r}?" if alias else ""
        hint = hint or _where_else(name, table) or _hint(name, known)
        self.error(path, f"unknown key {name!r}{hint}", value, ", ".join(known))

    def table(self, path: Path, value: Any) -> Mapping[Any, Any] | None:
        if isinstance(value, Mapping):
            return value
        self.error(path, f"must be a table, got {value!r}", value, "a table of keys")
        return None

    def leaf(self, path: Path, spec: Leaf, value: Any) -> None:
        try:
            self.leaves[path] = spec.normalize(value)
        except Invalid as exc:
            if str(exc):
                self.error(path, str(exc), value, spec.allowed)
            else:
                self.invalid(path, value, spec.allowed)

    def routes(self, path: Path, value: Any) -> None:
        if not isinstance(value, list | tuple):
            self.invalid(path, value, "a list of route tables ([[fallback.routes]])")
            return
        routes: list[Route] = []
        before = len(self.errors)
        for i, item in enumerate(value):
            item_path = (*path, f"[{i}]")
            if isinstance(item, Route):
                routes.append(item)
                continue
            table = self.table(item_path, item)
            if table is None:
                continue
            args: dict[str, Any] = {}
            for key, v in table.items():
                spec = _ROUTE_FIELDS.get(str(key))
                if spec is None:
                    self.unknown((*item_path, str(key)), list(_ROUTE_FIELDS), v, "")
                    continue
                try:
                    args[str(key)] = spec.normalize(v)
                except Invalid:
                    self.invalid((*item_path, str(key)), v, spec.allowed)
            for required in ("provider", "model"):
                if required not in table:
                    self.error(
                        (*item_path, required),
                        "missing",
                        None,
                        _ROUTE_FIELDS[required].allowed,
                    )
            if len(self.errors) == before:
                try:
                    routes.append(Route(**args))
                except ValueError as exc:
                    self.error(item_path, str(exc), table, "a valid route")
        if len(self.errors) == before:
            self.leaves[path] = tuple(routes)

    def limits(self, value: Any) -> None:
        scopes = self.table(("limits",), value)
        for scope, spec in (scopes or {}).items():
            path = ("limits", str(scope))
            problem = scope_key_problem(scope)
            if problem is not None:
                self.error(
                    path,
                    "empty key: a key needs a name"
                    if scope == ""
                    else f"invalid scope key {scope!r}: {problem}",
                    scope,
                    "provider:model[:project[:tenant]]",
                )
                continue
            if not isinstance(spec, Mapping):
                self.limit_spec(path, spec)
                continue
            # Every bad field is named together: an unknown key, a number past its
            # bound or a value of the wrong kind does not hide the others.
            before = len(self.errors)
            known: dict[str, Any] = {}
            for name, v in spec.items():
                if isinstance(name, str) and name in _LIMIT_FIELDS:
                    known[name] = v
                else:
                    self.unknown((*path, str(name)), list(_LIMIT_FIELDS), v, "limits")
            for name, v, allowed in limit_bound_problems(known) + limit_kind_problems(known):
                self.invalid((*path, name), v, allowed)
                del known[name]
            self.limit_spec(path, known)
            if len(self.errors) == before:
                for name, v in known.items():
                    self.leaves[(*path, name)] = v

    def limit_spec(self, path: Path, spec: Any) -> None:
        """LimitSpec's own checks of the fields left (lower bounds, kinds, formats)."""
        try:
            LimitSpec.from_mapping(spec, source=self.source, key=dotted(path))
        except ConfigError as exc:
            self.errors.extend(exc.errors)

    def locked(self, value: Any) -> None:
        path = ("governance", "locked")
        spec = SCHEMA["governance"]["locked"]
        if not isinstance(value, list | tuple):
            self.invalid(path, value, spec.allowed)
            return
        good: list[str] = []
        for i, item in enumerate(value):
            try:
                good.append(dotted(check_lock_path(item)))
            except Invalid:
                known = [
                    *SCHEMA[""],
                    *(f"{t}.{k}" for t in TABLES if t in SCHEMA for k in SCHEMA[t]),
                ]
                self.error(
                    ("governance", "locked", f"[{i}]"),
                    f"invalid value {item!r}{_hint(str(item), known)}",
                    item,
                    "the dot-path of a policy key or table, e.g. 'backoff.max_delay_secs', "
                    "'limits.\"openai:gpt-5\"' (governance cannot be locked)",
                )
        self.leaves[path] = tuple(good)


def check_layer(data: Any, source: str) -> tuple[dict[Path, Any], list[ConfigError]]:
    """Validate one raw layer; return its normalized leaves and every error found."""
    c = _Checker(source)
    if not isinstance(data, Mapping):
        c.errors.append(
            ConfigError(
                f"the policy must be a table of keys, got {data!r}",
                source=source,
                value=data,
                allowed="a table (mapping) at the top level",
            )
        )
        return c.leaves, c.errors
    top_known = [*SCHEMA[""], *TABLES]
    for key, value in data.items():
        name = str(key)
        if not name:
            # "" is SCHEMA's name for the top level, not a key a file may use.
            c.unknown((name,), top_known, value, "")
        elif name in SCHEMA[""]:
            c.leaf((name,), SCHEMA[""][name], value)
        elif name == "limits":
            c.limits(value)
        elif name == "governance":
            table = c.table((name,), value)
            for sub, v in (table or {}).items():
                if sub == "locked":
                    c.locked(v)
                else:
                    c.unknown((name, str(sub)), list(SCHEMA[name]), v, name)
        elif name in SCHEMA:
            table = c.table((name,), value)
            for sub, v in (table or {}).items():
                spec = SCHEMA[name].get(str(sub))
                if spec is None:
                    c.unknown((name, str(sub)), list(SCHEMA[name]), v, name)
                elif spec.kind == "routes":
                    c.routes((name, str(sub)), v)
                else:
                    c.leaf((name, str(sub)), spec, v)
        else:
            c.unknown((name,), top_known, value, "")
    return c.leaves, c.errors


def cross_check(values: Mapping[Path, Any]) -> list[tuple[Path, str, Any, str]]:
    """Rules between leaves of the effective policy: (path, message, value, allowed)."""
    problems: list[tuple[Path, str, Any, str]] = []
    initial = values[("backoff", "initial_delay_secs")]
    cap = values[("backoff", "max_delay_secs")]
    if initial > cap:
        problems.append(
            (
                ("backoff", "initial_delay_secs"),
                f"initial_delay_secs {initial:g} is above max_delay_secs {cap:g}",
                initial,
                f"1 <= initial_delay_secs <= max_delay_secs ({cap:g})",
            )
        )
    per_route = values[("attempts_per_route",)]
    attempts = values[("max_attempts",)]
    if per_route is not None and per_route > attempts:
        problems.append(
            (
                ("attempts_per_route",),
                f"attempts_per_route {per_route} is above max_attempts {attempts}",
                per_route,
                f"an integer from 1 to max_attempts ({attempts}), or unset",
            )
        )
    return problems


def default_leaves() -> dict[Path, Any]:
    """The default of every fixed leaf (limits have none: no scope is limited by default)."""
    return {
        ((name,) if table == "" else (table, name)): spec.default
        for table, leaves in SCHEMA.items()
        for name, spec in leaves.items()
    }
