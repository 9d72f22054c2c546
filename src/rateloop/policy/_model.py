"""The policy model: frozen values, validated whenever they are built.

:class:`Policy` is flat where the retry loop and the CLI read it
(``policy.max_delay_secs``), although the file keeps the five backoff keys
in a ``[backoff]`` table; provenance and error keys always use the file's
dot-paths (``backoff.max_delay_secs``).  Building a value in code validates
it with the same schema as a file (errors name the source ``code``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from rateloop._redact import redact_url
from rateloop.admission.spec import LimitSpec
from rateloop.errors import ConfigError
from rateloop.policy._build import PolicyWarning, merge
from rateloop.policy._checks import limit_bound_problems, scope_key_problem, shown
from rateloop.policy._layers import Layer
from rateloop.policy._paths import Path, dotted
from rateloop.policy._schema import SCHEMA, Invalid, check_lock_path, cross_check
from rateloop.route import Route
from rateloop.signal import DEFAULT_PAUSE_LIMIT_SECS
from rateloop.timing.backoff import Backoff, Jitter, Strategy
from rateloop.timing.budget import CallBudget, RunBudget

__all__ = [
    "AdmissionPolicy",
    "AgentsPolicy",
    "FallbackPolicy",
    "Governance",
    "LadderPolicy",
    "Policy",
]

_CODE = "code"


def _check(obj: object, names: Mapping[str, Path]) -> list[ConfigError]:
    """Validate and normalize ``obj``'s fields in place against the schema."""
    errors: list[ConfigError] = []
    for attr, path in names.items():
        spec = SCHEMA[path[0] if len(path) > 1 else ""][path[-1]]
        value = getattr(obj, attr)
        if spec.kind == "strs" and isinstance(value, frozenset | set):
            value = tuple(sorted(value))
        try:
            object.__setattr__(obj, attr, spec.normalize(value))
        except Invalid as exc:
            errors.append(
                ConfigError(
                    str(exc) or f"invalid value {shown(value)}",
                    source=_CODE,
                    key=dotted(path),
                    value=value,
                    allowed=spec.allowed,
                )
            )
    return errors


def _table_paths(table: str, attrs: Iterable[str]) -> dict[str, Path]:
    return {a: (table, a) for a in attrs}


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackPolicy:
    """Where a call may go when its route is limited, and the checks a route must pass."""

    routes: tuple[Route, ...] = ()
    allowed_providers: frozenset[str] | None = None
    max_cost_usd: float | None = None
    data_class: str | None = None

    def __post_init__(self) -> None:
        routes = tuple(self.routes)
        errors = [
            ConfigError(
                f"invalid route {r!r}",
                source=_CODE,
                key=f"fallback.routes[{i}]",
                value=r,
                allowed="a rateloop.route.Route",
            )
            for i, r in enumerate(routes)
            if not isinstance(r, Route)
        ]
        object.__setattr__(self, "routes", routes)
        errors += _check(
            self, _table_paths("fallback", ("allowed_providers", "max_cost_usd", "data_class"))
        )
        if errors:
            raise ConfigError.many(errors)
        if self.allowed_providers is not None:
            object.__setattr__(self, "allowed_providers", frozenset(self.allowed_providers))


@dataclass(frozen=True, slots=True, kw_only=True)
class LadderPolicy:
    """The ``[ladder]`` table: the degrade ladder of each priority class (docs/ladder.md).

    A class left unset (the default) has no ladder: its calls take the route and
    then its fallbacks, as without this table.  ``deferrable`` classes start on
    their cheapest rung; ``flex_discount`` and ``batch_discount`` are the
    tiers' price cuts (OpenAI's flex and batch: 50 %), used to price outcomes.
    """

    safety: tuple[str, ...] | None = None
    interactive: tuple[str, ...] | None = None
    scheduled: tuple[str, ...] | None = None
    background: tuple[str, ...] | None = None
    deferrable: tuple[str, ...] = ("background",)
    flex_discount: float = 0.5
    batch_discount: float = 0.5

    def __post_init__(self) -> None:
        errors = _check(self, _table_paths("ladder", SCHEMA["ladder"]))
        if errors:
            raise ConfigError.many(errors)

    def rungs_for(self, priority: str) -> tuple[str, ...] | None:
        """The ladder of a priority class, or None when it has none."""
        rungs: tuple[str, ...] | None = getattr(self, str(priority), None)
        return rungs if priority in _CLASSES else None


_CLASSES = frozenset({"safety", "interactive", "scheduled", "background"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentsPolicy:
    """The ``[agents]`` table, for ``rateloop run`` (strict here; the runner is lenient)."""

    max_retries: int = 5
    base_delay_secs: float = 60.0
    max_delay_secs: float = 600.0
    fallback_auto_model: bool = False
    max_step_output_bytes: int = 10_000_000

    def __post_init__(self) -> None:
        errors = _check(self, _table_paths("agents", SCHEMA["agents"]))
        if errors:
            raise ConfigError.many(errors)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionPolicy:
    """The ``[admission]`` table: where shared limiter state lives and what to do without it."""

    backend: str = "memory://"
    on_unreachable: Literal["fail_closed", "local"] = "fail_closed"
    local_share: float = 1.0
    cold_start: int = 8
    local_lease_secs: float | None = None

    def __post_init__(self) -> None:
        errors = _check(self, _table_paths("admission", SCHEMA["admission"]))
        if errors:
            raise ConfigError.many(errors)

    def __repr__(self) -> str:
        return (
            f"AdmissionPolicy(backend={redact_url(self.backend)!r}, "
            f"on_unreachable={self.on_unreachable!r}, local_share={self.local_share!r}, "
            f"cold_start={self.cold_start!r}, local_lease_secs={self.local_lease_secs!r})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Governance:
    """Locked dot-paths: later layers cannot change them (see :meth:`Policy.layered`)."""

    locked: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        errors: list[ConfigError] = []
        good: list[str] = []
        for i, text in enumerate(self.locked):
            try:
                good.append(dotted(check_lock_path(text)))
            except Invalid:
                errors.append(
                    ConfigError(
                        f"invalid value {text!r}",
                        source=_CODE,
                        key=f"governance.locked[{i}]",
                        value=text,
                        allowed="the dot-path of a policy key or table",
                    )
                )
        if errors:
            raise ConfigError.many(errors)
        object.__setattr__(self, "locked", tuple(good))


#: Policy attribute → its dot-path in a file.
_FLAT: Mapping[str, Path] = {
    **{name: (name,) for name in SCHEMA[""]},
    "strategy": ("backoff", "strategy"),
    "initial_delay_secs": ("backoff", "initial_delay_secs"),
    "max_delay_secs": ("backoff", "max_delay_secs"),
    "multiplier": ("backoff", "multiplier"),
    "jitter": ("backoff", "jitter"),
}
_SUBTABLES: Mapping[str, type] = {
    "fallback": FallbackPolicy,
    "ladder": LadderPolicy,
    "agents": AgentsPolicy,
    "admission": AdmissionPolicy,
    "governance": Governance,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """Everything configurable about retries, backoff, budgets, fallback and admission.

    Build it from files with :meth:`from_toml` / :meth:`from_yaml` /
    :meth:`from_pyproject`, from the environment with :meth:`from_env`, or
    stack several sources with :meth:`layered`.  ``warnings`` (lock
    conflicts) and ``provenance`` (dot-path → the layer each value came
    from) describe how it was built and are not part of equality.
    """

    max_attempts: int = 20
    recovery_budget_secs: float = 600.0
    initial_delay_secs: float = 5.0
    max_delay_secs: float = 60.0
    multiplier: float = 2.0
    strategy: Strategy = "exponential"
    jitter: Jitter = "equal"
    pause_limit_secs: float = DEFAULT_PAUSE_LIMIT_SECS
    trigger_scope: Literal["rate-limit", "transient", "all"] = "transient"
    on_exhausted: Literal["fail", "soft"] = "fail"
    attempts_per_route: int | None = None
    max_wait_secs: float | None = None
    max_error_attempts: int | None = None
    enabled: bool = True
    fallback: FallbackPolicy = field(default_factory=FallbackPolicy)
    ladder: LadderPolicy = field(default_factory=LadderPolicy)
    # A read-only mapping is not hashable; the hash leaves it out (equality does not).
    limits: Mapping[str, LimitSpec] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    agents: AgentsPolicy = field(default_factory=AgentsPolicy)
    admission: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    governance: Governance = field(default_factory=Governance)
    warnings: tuple[PolicyWarning, ...] = field(default=(), compare=False, repr=False)
    provenance: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        errors = _check(self, _FLAT)
        for name, kind in _SUBTABLES.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                errors.append(
                    ConfigError(
                        f"invalid value {value!r}",
                        source=_CODE,
                        key=name,
                        value=value,
                        allowed=f"a {kind.__name__}",
                    )
                )
        limits = dict(self.limits) if isinstance(self.limits, Mapping) else None
        if limits is None or not all(
            isinstance(k, str) and isinstance(v, LimitSpec) for k, v in limits.items()
        ):
            errors.append(
                ConfigError(
                    f"invalid value {self.limits!r}",
                    source=_CODE,
                    key="limits",
                    value=self.limits,
                    allowed="a mapping of scope key -> LimitSpec",
                )
            )
        for scope, spec in (limits or {}).items():
            problem = scope_key_problem(scope)
            if problem is not None:
                errors.append(
                    ConfigError(
                        f"invalid scope key {scope!r}: {problem}",
                        source=_CODE,
                        key=dotted(("limits", str(scope))),
                        value=scope,
                        allowed="provider:model[:project[:tenant]]",
                    )
                )
            elif isinstance(spec, LimitSpec):
                fields_ = {f.name: getattr(spec, f.name) for f in fields(LimitSpec)}
                errors += [
                    ConfigError(
                        f"invalid value {shown(value)}",
                        source=_CODE,
                        key=dotted(("limits", scope, name)),
                        value=value,
                        allowed=allowed,
                    )
                    for name, value, allowed in limit_bound_problems(fields_)
                ]
        if not errors:
            values = {path: getattr(self, attr) for attr, path in _FLAT.items()}
            errors += [
                ConfigError(msg, source=_CODE, key=dotted(path), value=value, allowed=allowed)
                for path, msg, value, allowed in cross_check(values)
            ]
        if errors:
            raise ConfigError.many(errors)
        object.__setattr__(self, "limits", MappingProxyType(dict(sorted(self.limits.items()))))
        object.__setattr__(self, "warnings", tuple(self.warnings))
        object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))

    # -- use ---------------------------------------------------------------

    def backoff(self, rng: Callable[[], float] | None = None) -> Backoff:
        """The :class:`~rateloop.timing.Backoff` this policy configures."""
        return Backoff.from_policy(self, rng=rng)

    def budget(
        self, *, started_at: float, deadline: float | None = None, run: RunBudget | None = None
    ) -> CallBudget:
        """A fresh :class:`~rateloop.timing.budget.CallBudget` for one call under this policy."""
        return CallBudget(
            max_attempts=self.max_attempts,
            recovery_budget_secs=self.recovery_budget_secs,
            started_at=started_at,
            deadline=deadline,
            max_wait_secs=self.max_wait_secs,
            run=run,
            max_error_attempts=self.max_error_attempts,
        )

    def leaves(self) -> dict[str, Any]:
        """Every effective value by dot-path, in file order (what ``config check`` prints)."""
        out: dict[str, Any] = {
            dotted(path): getattr(self, attr) for attr, path in _FLAT.items() if len(path) == 1
        }
        for attr, path in _FLAT.items():
            if len(path) > 1:
                out[dotted(path)] = getattr(self, attr)
        for f in fields(FallbackPolicy):
            out[f"fallback.{f.name}"] = getattr(self.fallback, f.name)
        for scope, spec in self.limits.items():
            for f in fields(LimitSpec):
                out[dotted(("limits", scope, f.name))] = getattr(spec, f.name)
        for table in ("ladder", "agents", "admission", "governance"):
            sub = getattr(self, table)
            for f in fields(sub):
                out[f"{table}.{f.name}"] = getattr(sub, f.name)
        return out

    # -- loading -------------------------------------------------------------

    @classmethod
    def layered(cls, *layers: Layer) -> Policy:
        """Merge ``layers`` over the defaults (later wins; locks hold; see the module docs)."""
        merged = merge(layers)
        v = merged.values
        limits: dict[str, dict[str, Any]] = {}
        for path, value in v.items():
            if path[0] == "limits":
                limits.setdefault(path[1], {})[path[2]] = value
        provenance = {dotted(p): s for p, s in merged.provenance.items()}
        for scope in limits:
            for f in fields(LimitSpec):
                provenance.setdefault(dotted(("limits", scope, f.name)), "defaults")
        allowed = v[("fallback", "allowed_providers")]
        return cls(
            **{attr: v[path] for attr, path in _FLAT.items()},
            fallback=FallbackPolicy(
                routes=v[("fallback", "routes")],
                allowed_providers=None if allowed is None else frozenset(allowed),
                max_cost_usd=v[("fallback", "max_cost_usd")],
                data_class=v[("fallback", "data_class")],
            ),
            ladder=LadderPolicy(**{k: v[("ladder", k)] for k in SCHEMA["ladder"]}),
            limits={scope: LimitSpec(**spec) for scope, spec in limits.items()},
            agents=AgentsPolicy(**{k: v[("agents", k)] for k in SCHEMA["agents"]}),
            admission=AdmissionPolicy(**{k: v[("admission", k)] for k in SCHEMA["admission"]}),
            governance=Governance(locked=v[("governance", "locked")]),
            warnings=merged.warnings,
            provenance=provenance,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = _CODE) -> Policy:
        """A policy from a mapping shaped like the file, over the defaults."""
        return cls.layered(Layer.defaults(), Layer(source, data))

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Policy:
        return cls.layered(Layer.defaults(), Layer.from_toml(path))

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Policy:
        return cls.layered(Layer.defaults(), Layer.from_yaml(path))

    @classmethod
    def from_pyproject(cls, path: str | os.PathLike[str] = "pyproject.toml") -> Policy:
        """The ``[tool.rateloop]`` table of a pyproject.toml."""
        return cls.layered(Layer.defaults(), Layer.from_pyproject(path))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Policy:
        """TOML, YAML or pyproject.toml, chosen by the file name."""
        return cls.layered(Layer.defaults(), Layer.from_file(path))

    @classmethod
    def from_env(
        cls, prefix: str = "RATELOOP_", environ: Mapping[str, str] | None = None
    ) -> Policy:
        """``RATELOOP_MAX_ATTEMPTS=5``, ``RATELOOP_BACKOFF__MAX_DELAY_SECS=30`` (see Layer)."""
        return cls.layered(Layer.defaults(), Layer.from_env(prefix, environ))
