"""The configured limits of one scope key, validated when they load.

In a policy file::

    [limits."openai:gpt-5:proj-1"]
    requests_per_minute = 500
    input_tokens_per_minute = 200_000
    output_tokens_per_minute = 40_000
    requests_per_day = 10_000
    day_window = "fixed"          # or "rolling"
    day_resets_at = "00:00"       # UTC, for the fixed window
    concurrency = 8
    lease_ttl_secs = 600
    enqueued_tokens = 2_000_000   # a batch queue: input tokens in flight (admission.holds)
    burst = 0.5                   # fraction of a minute's allowance usable at once
                                  # (unset: the profile's pacing, 1 s of the rate)
    reserve = 0.1                 # fraction kept back from each lower priority class
    profile = "openai"            # how usage is charged (unset: the route's provider)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from difflib import get_close_matches
from typing import Any, Literal

from rateloop.admission.profile import PROFILES
from rateloop.errors import ConfigError

__all__ = ["LimitSpec"]

_RATE_KEYS = (
    "requests_per_minute",
    "input_tokens_per_minute",
    "output_tokens_per_minute",
    "tokens_per_minute",
    "requests_per_day",
    "concurrency",
)
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitSpec:
    """Limits of one scope; ``None`` means that dimension is not limited."""

    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    output_tokens_per_minute: int | None = None
    tokens_per_minute: int | None = None
    requests_per_day: int | None = None
    day_window: Literal["fixed", "rolling"] = "fixed"
    day_resets_at: str = "00:00"
    concurrency: int | None = None
    lease_ttl_secs: float = 600.0
    burst: float | None = None
    reserve: float = 0.0
    profile: str | None = None
    #: A provider's batch queue limit: input tokens of the batches in flight, held from
    #: submission until the batch ends (:class:`rateloop.admission.holds.HeldCapacity`).
    enqueued_tokens: int | None = None

    def __post_init__(self) -> None:
        errors = _validate(self, source=None, prefix="")
        if errors:
            raise ConfigError.many(errors)

    @property
    def empty(self) -> bool:
        """True when no dimension is limited."""
        return all(getattr(self, k) is None for k in _RATE_KEYS)

    @property
    def day_reset_minute(self) -> int:
        """Minutes after 00:00 UTC at which the fixed day window resets."""
        hh, mm = self.day_resets_at.split(":")
        return int(hh) * 60 + int(mm)

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, source: str | None = None, key: str = ""
    ) -> LimitSpec:
        """Build and validate a spec; errors name ``source``, ``key.field`` and the value."""
        prefix = f"{key}." if key else ""
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"must be a table of limits, got {data!r}",
                source=source,
                key=key or None,
                value=data,
                allowed="a table such as {requests_per_minute = 500}",
            )
        known = [f.name for f in fields(cls)]
        errors: list[ConfigError] = []
        for name in data:
            if name not in known:
                hint = get_close_matches(str(name), known, n=1)
                did = f"; did you mean {hint[0]!r}?" if hint else ""
                errors.append(
                    ConfigError(
                        f"unknown key {name!r}{did}",
                        source=source,
                        key=f"{prefix}{name}",
                        value=data[name],
                        allowed=", ".join(known),
                    )
                )
        if errors:
            raise ConfigError.many(errors)
        try:
            return cls(**dict(data))
        except ConfigError as exc:
            # The dataclass validated without knowing where the values came from.
            raise ConfigError.many(
                [
                    ConfigError(
                        e.detail,
                        source=source,
                        key=f"{prefix}{e.key}" if e.key else key,
                        value=e.value,
                        allowed=e.allowed,
                    )
                    for e in exc.errors
                ]
            ) from None


def _validate(spec: LimitSpec, *, source: str | None, prefix: str) -> list[ConfigError]:
    errors: list[ConfigError] = []

    def bad(name: str, value: object, allowed: str) -> None:
        errors.append(
            ConfigError(
                f"invalid value {value!r}",
                source=source,
                key=f"{prefix}{name}",
                value=value,
                allowed=allowed,
            )
        )

    for name in _RATE_KEYS:
        value = getattr(spec, name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            bad(name, value, "an integer >= 1, or leave it unset for no limit")
    queued = spec.enqueued_tokens
    if queued is not None and (isinstance(queued, bool) or not isinstance(queued, int)
                               or queued < 1):
        bad("enqueued_tokens", queued, "an integer >= 1, or leave it unset for no limit")
    if spec.day_window not in ("fixed", "rolling"):
        bad("day_window", spec.day_window, "'fixed' or 'rolling'")
    if not isinstance(spec.day_resets_at, str) or not _HHMM.match(spec.day_resets_at):
        bad("day_resets_at", spec.day_resets_at, "a UTC time 'HH:MM', e.g. '00:00'")
    ttl = spec.lease_ttl_secs
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 1 <= ttl <= 86_400:
        bad("lease_ttl_secs", ttl, "a number of seconds from 1 to 86400")
    burst = spec.burst
    if burst is not None and (
        isinstance(burst, bool)
        or not isinstance(burst, int | float)
        or math.isnan(burst)
        or not 0 < burst <= 1
    ):
        bad("burst", burst, "a fraction 0 < burst <= 1, or unset for the profile's pacing")
    reserve = spec.reserve
    if (
        isinstance(reserve, bool)
        or not isinstance(reserve, int | float)
        or math.isnan(reserve)
        or not 0 <= reserve < 0.5
    ):
        bad("reserve", reserve, "a fraction 0 <= reserve < 0.5")
    if spec.profile is not None and (
        not isinstance(spec.profile, str) or spec.profile not in PROFILES
    ):
        bad("profile", spec.profile, ", ".join(repr(p) for p in PROFILES))
    return errors
