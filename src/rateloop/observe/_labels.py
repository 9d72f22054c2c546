"""Which label values a metric sink exports: bounded, identifiers only, tenant opt-in.

How it works.  Every label set a metric sink writes (and the attributes of an
OpenTelemetry span) passes through :meth:`LabelBounds.apply` on its way to the
backend.  The rules, in order:

1. ``tenant`` is dropped, and the tenant part of ``scope``
   (``provider:model:project:tenant``) cut off, unless the sink was built with
   ``tenant_labels=True``: a tenant per series multiplies every metric by the
   number of tenants, and a tenant name can be a customer's name.
2. ``operation`` is free text from the caller (``loop.call(..., operation=...)``):
   it is kept only when it is a safe token (:data:`OPERATION_TOKEN`: letters,
   digits and ``_ . - /``, at most 64 characters, nothing a redaction would
   change), else it becomes ``other``.  A prompt passed there is never exported.
3. Each label keeps at most :data:`LABEL_LIMITS` distinct values per sink (the
   first ones seen); later new values fold into ``other``.  So a series count
   is bounded whatever the callers pass.

The bounds hold for the life of the sink (a process), like the series they protect.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping

from rateloop._redact import redact
from rateloop.errors import ConfigError

__all__ = ["LABEL_LIMITS", "OPERATION_TOKEN", "OTHER", "LabelBounds", "safe_operation"]

OTHER = "other"
#: Distinct values kept per label and sink before new ones fold into ``other``.
LABEL_LIMITS: Mapping[str, int] = {
    "provider": 32,  # a fleet talks to a handful of providers
    "model": 64,
    "scope": 256,  # provider x model x project
    "tenant": 256,  # only with tenant_labels=True
    "operation": 32,  # operation names are a small vocabulary of the caller's code
    "priority": 16,
    # The labels of one metric, from rateloop's own closed vocabularies.
    "decision": 32,
    "signal_kind": 32,
    "result": 16,
    "wait_kind": 8,
    "status": 32,
    "layer": 8,
    "rung": 8,  # the degrade ladder's rungs
}
_DEFAULT_LIMIT = 32  # a label not named above
OPERATION_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,63}")


def _tenantless(scope: str) -> str:
    # provider:model:project:tenant -> provider:model:project (Route.scopes' layout).
    parts = scope.split(":")
    return ":".join(parts[:3]) if len(parts) >= 4 else scope


@functools.lru_cache(maxsize=4096)  # operation names repeat; redact() is the cost
def safe_operation(value: str) -> str:
    """``value`` if it is a safe operation token (rule 2), else ``other``."""
    if OPERATION_TOKEN.fullmatch(value) and redact(value) == value:
        return value
    return OTHER


class LabelBounds:
    """The label policy of one sink: ``apply(labels)`` gives what may be exported.

    >>> bounds = LabelBounds(label_limits={"operation": 1})
    >>> bounds.apply({"operation": "chat", "scope": "a:b:p:acme", "tenant": "acme"})
    {'operation': 'chat', 'scope': 'a:b:p'}
    >>> bounds.apply({"operation": "embed"})["operation"], bounds.apply({"operation": "x y"})
    ('other', {'operation': 'other'})
    """

    def __init__(
        self, *, tenant_labels: bool = False, label_limits: Mapping[str, int] | None = None
    ) -> None:
        limits = dict(LABEL_LIMITS)
        for name, limit in (label_limits or {}).items():
            if name not in LABEL_LIMITS:
                raise ConfigError(
                    f"no label named {name!r}",
                    key="label_limits",
                    value=name,
                    allowed=", ".join(sorted(LABEL_LIMITS)),
                )
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ConfigError(
                    f"the bound of {name!r} must be an int >= 1, got {limit!r}",
                    key="label_limits",
                    value=limit,
                    allowed="an int >= 1",
                )
            limits[name] = limit
        self.tenant_labels = tenant_labels
        self.limits: Mapping[str, int] = limits
        self._seen: dict[str, set[str]] = {name: set() for name in limits}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LabelBounds(tenant_labels={self.tenant_labels!r})"

    def names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The label names a metric is declared with (no ``tenant`` unless opted in)."""
        return names if self.tenant_labels else tuple(n for n in names if n != "tenant")

    def apply(self, labels: Mapping[str, str]) -> dict[str, str]:
        """``labels`` as they may be exported (see the module docstring's rules)."""
        out: dict[str, str] = {}
        for name, given in labels.items():
            if name == "tenant" and not self.tenant_labels:
                continue
            value = given
            if name == "scope" and not self.tenant_labels:
                value = _tenantless(given)
            elif name == "operation" and given:
                value = safe_operation(given)
            out[name] = self._bounded(name, value)
        return out

    def _bounded(self, name: str, value: str) -> str:
        seen = self._seen.get(name)
        if not value or value == OTHER or (seen is not None and value in seen):
            return value  # an empty value is "not set"
        with self._lock:
            seen = self._seen.setdefault(name, set())
            if value in seen:
                return value
            if len(seen) >= self.limits.get(name, _DEFAULT_LIMIT):
                return OTHER
            seen.add(value)
            return value
