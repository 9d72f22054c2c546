"""Merging layers: later layers win, leaf by leaf, except where a path is locked.

How it works.  The effective policy starts as the defaults (source
``defaults``).  Each layer, in order, is validated on its own (so a file is
always valid by itself) and its leaves are applied one by one: a leaf
replaces the effective value and records the layer as its provenance.
Tables therefore merge leaf by leaf while lists (``fallback.routes``,
``fallback.allowed_providers``) are single leaves and are replaced whole.

``governance.locked`` lists dot-paths (a leaf, or a table to lock every leaf
under it).  A lock declared in layer *k* takes effect after layer *k* is
applied, so it freezes the value layer *k* left.  Locks accumulate: a later
layer can add locks but never lift one.  A later layer's attempt to change
a locked value is not applied and not dropped silently: it becomes a
:class:`PolicyWarning`, logged on the ``rateloop.policy`` logger and kept on
the policy (``Policy.warnings``).  Setting a locked path to the value it
already has is not a change and is not reported.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rateloop.errors import ConfigError, PolicyWarning
from rateloop.policy._layers import Layer
from rateloop.policy._paths import Path, dotted, parse_path
from rateloop.policy._schema import check_layer, cross_check, default_leaves

__all__ = ["Merged", "PolicyWarning", "merge"]

log = logging.getLogger("rateloop.policy")
# A library does not print by itself: without the application's logging set up,
# lock warnings stay on Policy.warnings instead of reaching stderr via lastResort.
log.addHandler(logging.NullHandler())

_LOCKED: Path = ("governance", "locked")


@dataclass(frozen=True, slots=True, kw_only=True)
class Merged:
    """The effective leaves, where each came from, the locks and the warnings."""

    values: Mapping[Path, Any]
    provenance: Mapping[Path, str]
    locks: Mapping[Path, str]
    warnings: tuple[PolicyWarning, ...]


def _locked_by(path: Path, locks: Mapping[Path, str]) -> tuple[Path, str] | None:
    for lock, source in locks.items():
        if path[: len(lock)] == lock:
            return lock, source
    return None


def merge(layers: Sequence[Layer]) -> Merged:
    """Validate and merge ``layers`` over the defaults; raise every error together."""
    values: dict[Path, Any] = default_leaves()
    provenance: dict[Path, str] = dict.fromkeys(values, "defaults")
    locks: dict[Path, str] = {}
    warnings: list[PolicyWarning] = []
    errors: list[ConfigError] = []
    for layer in layers:
        if not isinstance(layer, Layer):
            raise TypeError(f"Policy.layered takes Layer objects, got {layer!r}")
        leaves, found = check_layer(layer.data, layer.source)
        errors.extend(found)
        if found:
            continue
        for path, value in leaves.items():
            if path == _LOCKED:
                continue
            lock = _locked_by(path, locks)
            if lock is not None and values.get(path) != value:
                warning = PolicyWarning(
                    path=dotted(path),
                    layer=layer.source,
                    attempted_value=value,
                    kept_value=values.get(path),
                    locked_by=lock[1],
                )
                log.warning("policy lock: %s", warning)
                warnings.append(warning)
                continue
            values[path] = value
            provenance[path] = layer.source
        for text in leaves.get(_LOCKED, ()):
            path = parse_path(text)
            if _locked_by(path, locks) is None:
                locks[path] = layer.source
    if not errors:
        for path, message, value, allowed in cross_check(values):
            errors.append(
                ConfigError(
                    message,
                    source=provenance.get(path, "defaults"),
                    key=dotted(path),
                    value=value,
                    allowed=allowed,
                )
            )
    if errors:
        raise ConfigError.many(errors)
    values[_LOCKED] = tuple(dotted(p) for p in locks)
    provenance[_LOCKED] = ", ".join(dict.fromkeys(locks.values())) or "defaults"
    return Merged(values=values, provenance=provenance, locks=locks, warnings=tuple(warnings))
