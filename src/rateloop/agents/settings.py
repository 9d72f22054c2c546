"""The knobs of ``rateloop run``: how many retries, how long to wait, the auto-model fallback.

How it works: each source of settings (the policy file, the environment,
command-line flags) is read into a :class:`SettingsLayer` whose fields are
``None`` where the source says nothing.  :func:`resolve_settings` stacks the
layers over the defaults (flags > env > policy file > defaults) and then
normalizes the result once: ``max_retries`` is clamped to ``[0, 100]``, a
delay is clamped to ``[0, MAX_WAIT_SECONDS]`` (a day: no sleep overflows)
and rounded to the millisecond,
and ``max_delay_secs`` is raised to ``base_delay_secs`` when it is lower.

Environment parsing is lenient on purpose: these variables are set by CI
systems and recipe runners the step cannot control, and a typo there must
not crash a long agent run.  An unset, empty or unparseable value is treated
as unset (so the layer below, usually the default, applies).

The parse follows amplihack's published contract (``v.trim().parse::<u32>()``
for the retry count, ``parse::<u64>()`` for the delays) so that the same
``AMPLIHACK_RATELIMIT_*`` value means the same thing here: the retry count is
an unsigned 32-bit decimal (optional ``+``, ASCII digits, at most
4294967295, surrounding whitespace ignored), and ``-1``, ``2.5``, ``1e3``,
``0x10`` or ``4294967296`` are rejected, so the default applies; it is then
clamped to ``MAX_RETRIES_LIMIT``.  Delays accept what the contract accepts
plus fractions (``2.5``); a negative, NaN or infinite delay is rejected too
(the default, not "no waits").
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from rateloop.policy import Policy
from rateloop.signal import MAX_WAIT_SECONDS

__all__ = [
    "DEFAULT_BASE_DELAY_SECS",
    "DEFAULT_MAX_DELAY_SECS",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_STEP_OUTPUT_BYTES",
    "DEFAULT_WAIT_FOR_RESET",
    "ENV_ALIASES",
    "ENV_KEYS",
    "MAX_RETRIES_LIMIT",
    "MAX_WAIT_FOR_RESET",
    "AgentSettings",
    "SettingsLayer",
    "layer_from_env",
    "layer_from_policy",
    "parse_wait_limit",
    "resolve_settings",
]

DEFAULT_MAX_RETRIES = 5
DEFAULT_BASE_DELAY_SECS = 60.0
DEFAULT_MAX_DELAY_SECS = 600.0
DEFAULT_MAX_STEP_OUTPUT_BYTES = 10_000_000
_T = TypeVar("_T")

#: ``--wait-for-reset`` without a value: wait for a reset up to 6 hours away.
DEFAULT_WAIT_FOR_RESET = 6 * 3600.0
#: The longest ``--wait-for-reset`` accepted: a week (the longest agent usage window).
MAX_WAIT_FOR_RESET = 7 * 86_400.0
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_WAIT_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")

#: ``max_retries`` above this is clamped: a step is never run more than 101 times.
MAX_RETRIES_LIMIT = 100

#: The environment key that sets each field.
ENV_KEYS: Mapping[str, str] = {
    "max_retries": "RATELOOP_MAX_RETRIES",
    "base_delay_secs": "RATELOOP_BASE_DELAY_SECS",
    "max_delay_secs": "RATELOOP_MAX_DELAY_SECS",
    "fallback_auto_model": "RATELOOP_FALLBACK_AUTO_MODEL",
    "max_step_output_bytes": "RATELOOP_MAX_STEP_OUTPUT_BYTES",
}

#: amplihack's published names, read when the ``RATELOOP_`` key is unset or unusable.
ENV_ALIASES: Mapping[str, str] = {
    "max_retries": "AMPLIHACK_RATELIMIT_MAX_RETRIES",
    "base_delay_secs": "AMPLIHACK_RATELIMIT_BASE_DELAY_SECS",
    "max_delay_secs": "AMPLIHACK_RATELIMIT_MAX_DELAY_SECS",
    "fallback_auto_model": "AMPLIHACK_RATELIMIT_FALLBACK_AUTO_MODEL",
}

# A non-empty RATELOOP_FALLBACK_AUTO_MODEL turns the fallback on, except these
# spellings, which read as an explicit "off" (so RATELOOP_...=0 can override an alias).
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    """Resolved, normalized settings of one agent step.

    Build it with :func:`resolve_settings` (or :meth:`from_env`); the
    constructor takes the values as they are, and :meth:`normalized` applies
    the clamps.
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    base_delay_secs: float = DEFAULT_BASE_DELAY_SECS
    max_delay_secs: float = DEFAULT_MAX_DELAY_SECS
    fallback_auto_model: bool = False
    max_step_output_bytes: int = DEFAULT_MAX_STEP_OUTPUT_BYTES

    @property
    def max_executions(self) -> int:
        """How many times the step may run: the first try plus every retry."""
        return 1 + self.max_retries

    def normalized(self) -> AgentSettings:
        """The same settings with every documented clamp applied."""
        retries = min(max(self.max_retries, 0), MAX_RETRIES_LIMIT)
        base = _delay(self.base_delay_secs, DEFAULT_BASE_DELAY_SECS)
        cap = max(_delay(self.max_delay_secs, DEFAULT_MAX_DELAY_SECS), base)
        limit = self.max_step_output_bytes
        if limit <= 0:
            limit = DEFAULT_MAX_STEP_OUTPUT_BYTES
        return AgentSettings(
            max_retries=retries,
            base_delay_secs=base,
            max_delay_secs=cap,
            fallback_auto_model=bool(self.fallback_auto_model),
            max_step_output_bytes=limit,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentSettings:
        """Defaults overlaid with ``environ`` (pass ``os.environ`` explicitly)."""
        return resolve_settings(env=layer_from_env(environ))

    def __repr__(self) -> str:
        return (
            f"AgentSettings(max_retries={self.max_retries}, "
            f"base_delay_secs={self.base_delay_secs:g}, max_delay_secs={self.max_delay_secs:g}, "
            f"fallback_auto_model={self.fallback_auto_model}, "
            f"max_step_output_bytes={self.max_step_output_bytes})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingsLayer:
    """What one source says; ``None`` means "this source does not set it"."""

    max_retries: int | None = None
    base_delay_secs: float | None = None
    max_delay_secs: float | None = None
    fallback_auto_model: bool | None = None
    max_step_output_bytes: int | None = None

    def over(self, below: AgentSettings) -> AgentSettings:
        """``below`` with every field this layer sets replaced."""
        changes = {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }
        return replace(below, **changes)


def resolve_settings(
    *,
    flags: SettingsLayer | None = None,
    env: SettingsLayer | None = None,
    policy: SettingsLayer | None = None,
) -> AgentSettings:
    """Stack the layers (flags > env > policy file > defaults) and normalize."""
    settings = AgentSettings()
    for layer in (policy, env, flags):
        if layer is not None:
            settings = layer.over(settings)
    return settings.normalized()


def layer_from_env(environ: Mapping[str, str]) -> SettingsLayer:
    """Read the ``RATELOOP_*`` keys and their ``AMPLIHACK_RATELIMIT_*`` aliases, leniently.

    For each field the ``RATELOOP_`` key is tried first; when it is unset or
    unparseable the alias is tried.  Nothing here raises.
    """

    def lookup(name: str, parse: Callable[[str | None], _T | None]) -> _T | None:
        for key in (ENV_KEYS.get(name), ENV_ALIASES.get(name)):
            if key is None:
                continue
            value = parse(environ.get(key))
            if value is not None:
                return value
        return None

    return SettingsLayer(
        max_retries=lookup("max_retries", _parse_u32),
        base_delay_secs=lookup("base_delay_secs", _parse_secs),
        max_delay_secs=lookup("max_delay_secs", _parse_secs),
        fallback_auto_model=lookup("fallback_auto_model", _parse_switch),
        max_step_output_bytes=lookup("max_step_output_bytes", _parse_u64),
    )


def layer_from_policy(path: str | os.PathLike[str]) -> SettingsLayer:
    """The ``[agents]`` table of a policy file (TOML, YAML or pyproject.toml, by name).

    The policy file is validated strictly by :mod:`rateloop.policy` (a bad
    file raises :class:`~rateloop.errors.ConfigError` naming the key); unlike
    the environment, a file is something the user wrote on purpose.
    """
    agents = Policy.from_file(path).agents
    return SettingsLayer(
        max_retries=agents.max_retries,
        base_delay_secs=agents.base_delay_secs,
        max_delay_secs=agents.max_delay_secs,
        fallback_auto_model=agents.fallback_auto_model,
        max_step_output_bytes=agents.max_step_output_bytes,
    )


# -- lenient parsers ---------------------------------------------------------------------------


# Rust's str::trim strips the Unicode White_Space characters, which are not quite
# Python's str.isspace (that also counts U+001C..U+001F).
_RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


def _parse_unsigned(raw: str | None, limit: int) -> int | None:
    """What Rust's ``raw.trim().parse::<uN>()`` accepts, or None.

    An optional ``+``, then ASCII digits only (no ``-``, no ``_``, no other
    scripts' digits, no fraction or exponent), at most ``limit``.

    >>> [_parse_u32(v) for v in ("7", " +7 ", "-1", "2.5", "4294967295", "4294967296", "")]
    [7, 7, None, None, 4294967295, None, None]
    """
    if raw is None:
        return None
    text = raw.strip(_RUST_WHITESPACE)
    if text.startswith("+"):
        text = text[1:]
    if not text or not (text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value <= limit else None


def _parse_u32(raw: str | None) -> int | None:
    return _parse_unsigned(raw, _U32_MAX)


def _parse_u64(raw: str | None) -> int | None:
    return _parse_unsigned(raw, _U64_MAX)


def _parse_secs(raw: str | None) -> float | None:
    """A finite number of seconds >= 0, or None (unset, empty, garbage, negative, NaN, inf)."""
    if raw is None:
        return None
    text = raw.strip(_RUST_WHITESPACE)
    # float() would also take "1_000" and other scripts' digits; a delay is plain ASCII.
    if not text or not text.isascii() or "_" in text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _parse_switch(raw: str | None) -> bool | None:
    """Non-empty means on, except ``0``/``false``/``no``/``off``; unset or empty is None."""
    if raw is None or not raw.strip():
        return None
    return raw.strip().lower() not in _FALSE_WORDS


def _delay(value: float, default: float) -> float:
    """A delay within [0, MAX_WAIT_SECONDS] to the millisecond; NaN is the default.

    Millisecond resolution keeps the backoff arithmetic away from subnormal
    floats (a base of 1e-311 s is 0: no waits).
    """
    if math.isnan(value):
        return default
    return round(min(max(float(value), 0.0), MAX_WAIT_SECONDS), 3)


def parse_wait_limit(text: str) -> float:
    """``--wait-for-reset``'s MAX in seconds: ``3600``, ``90m``, ``6h``, ``1h30m``, ``1.5h``.

    A bare number is seconds.  Raises :class:`ValueError` naming the value and
    the accepted forms when it is malformed, not positive, or over a week.

    >>> parse_wait_limit("90m"), parse_wait_limit("1h30m"), parse_wait_limit("3600")
    (5400.0, 5400.0, 3600.0)
    """
    raw = text.strip().lower()
    forms = "seconds (3600) or a duration like 90m, 6h, 1h30m, 2d"
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        seconds = float(raw)
    elif re.fullmatch(r"(?:\d+(?:\.\d+)?[smhd])+", raw):
        seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _WAIT_PART.findall(raw))
    else:
        raise ValueError(f"{text!r} is not a wait limit: give {forms}")
    if not 0 < seconds <= MAX_WAIT_FOR_RESET:
        raise ValueError(f"{text!r} must be more than 0 and at most 7d (a week); give {forms}")
    return seconds
