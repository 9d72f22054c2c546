"""One configurable value of the policy file: :class:`Leaf`, its kinds and its bounds.

:data:`~rateloop.policy._schema.SCHEMA` is a table of these; :meth:`Leaf.normalize`
gives a value's canonical form or raises :class:`Invalid`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from rateloop.policy._checks import rungs_problem, url_problem

__all__ = ["Invalid", "Leaf", "LeafKind", "choice_leaf", "num_leaf"]

LeafKind = Literal["int", "float", "bool", "str", "url", "choice", "strs", "routes", "rungs"]


class Invalid(Exception):
    """A leaf value that does not fit its :class:`Leaf`; ``allowed`` says what would.

    Its message, when it has one, says what is wrong better than "invalid value".
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf:
    """One configurable value: its kind, default, bounds and the allowed sentence."""

    kind: LeafKind
    default: Any
    allowed: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    lo_open: bool = False

    def normalize(self, value: Any) -> Any:
        """The value in canonical form (int → float for floats, list → tuple), or Invalid."""
        if value is None:
            if self.optional:
                return None
            raise Invalid
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise Invalid
            return value
        if self.kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise Invalid
            if self.kind == "int" and not isinstance(value, int):
                raise Invalid
            try:
                number = value if self.kind == "int" else float(value)
                if math.isnan(number) or math.isinf(number):
                    raise Invalid
            except OverflowError:  # an int too large for a float
                raise Invalid from None
            if self.lo is not None and (number <= self.lo if self.lo_open else number < self.lo):
                raise Invalid
            if self.hi is not None and number > self.hi:
                raise Invalid
            return number
        if self.kind == "url":
            if not isinstance(value, str) or url_problem(value) is not None:
                raise Invalid
            return value
        if self.kind in ("str", "choice"):
            if not isinstance(value, str) or not value.strip():
                raise Invalid
            if self.choices and value not in self.choices:
                raise Invalid
            return value
        if self.kind in ("strs", "rungs"):
            if not isinstance(value, list | tuple) or not all(
                isinstance(v, str) and v.strip() for v in value
            ):
                raise Invalid
            if self.kind == "rungs":
                problem = rungs_problem(tuple(value), self.choices)
                if problem is not None:
                    raise Invalid(problem)
            elif self.choices and (bad := [v for v in value if v not in self.choices]):
                raise Invalid(f"unknown value {bad[0]!r}")
            return tuple(value)
        raise Invalid  # pragma: no cover - routes are handled by check_routes


def num_leaf(
    kind: LeafKind, default: Any, lo: float, hi: float | None, unit: str = "", **kw: Any
) -> Leaf:
    kind_word = "an integer" if kind == "int" else "a number"
    if hi is None:
        allowed = f"{kind_word}{unit} >{'' if kw.get('lo_open') else '='} {lo:g}"
    else:
        allowed = f"{kind_word}{unit} from {lo:g} to {hi:g}"
    if kw.get("optional"):
        allowed += ", or unset"
    return Leaf(kind=kind, default=default, allowed=allowed, lo=lo, hi=hi, **kw)


def choice_leaf(default: str, *choices: str) -> Leaf:
    return Leaf(
        kind="choice",
        default=default,
        choices=choices,
        allowed=" | ".join(repr(c) for c in choices),
    )
