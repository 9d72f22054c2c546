"""The FakeProvider's limits: continuously refilled buckets, as providers enforce them.

How it works.  Every per-minute limit is a bucket that refills at
``limit / 60`` per second, continuously, and holds at most ``burst_seconds``
worth of it: a 600 RPM limit with a 5 s burst admits 50 requests at once and
then 10 a second (Anthropic and OpenAI both document "continuously
replenished" limits that are enforced over short intervals, so a minute's
allowance cannot be spent in its first second).  A request costs its amount
when the bucket holds at least ``min(amount, capacity)``: a request larger
than the burst is admitted from a full bucket and leaves it in debt, so a
big request is slow rather than impossible; a request larger than the whole
minute's limit never fits.

Which tokens count, and when, is the provider's *counting profile*:

- ``openai``: input plus ``max_tokens`` are counted at admission against the
  tokens-per-minute limit and kept (OpenAI counts the max_tokens requested).
- ``anthropic``: input tokens (cache reads excluded) against ITPM; output
  estimated from ``max_tokens`` at admission against OTPM, then corrected to
  the tokens really produced when the response ends.
- ``gemini``: input tokens against the tokens-per-minute limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["PROFILES", "Bucket", "FakeLimits", "Profile", "TokenCharge", "charge_of"]

Profile = Literal["openai", "anthropic", "gemini"]
PROFILES: tuple[Profile, ...] = ("openai", "anthropic", "gemini")


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeLimits:
    """What the fake provider enforces; ``None`` leaves a dimension unlimited.

    ``rpm``/``tpm``/``itpm``/``otpm`` are per minute (``tpm`` counts input and
    output together), ``rpd`` per UTC day, ``concurrency`` in flight at once.
    """

    rpm: int | None = None
    tpm: int | None = None
    itpm: int | None = None
    otpm: int | None = None
    rpd: int | None = None
    concurrency: int | None = None
    burst_seconds: float = 5.0

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "itpm", "otpm", "rpd", "concurrency"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"FakeLimits.{name} must be an integer >= 1 or None (unlimited), "
                    f"got {value!r}"
                )
        burst = self.burst_seconds
        if (
            isinstance(burst, bool)
            or not isinstance(burst, int | float)
            or not 0 < burst <= 60
        ):
            raise ValueError(
                f"FakeLimits.burst_seconds must be a number of seconds 0 < burst <= 60, "
                f"got {burst!r}"
            )


class Bucket:
    """A continuously refilled bucket of one per-minute limit."""

    __slots__ = ("capacity", "level", "limit", "rate", "updated")

    def __init__(self, limit: int, burst_seconds: float, now: float) -> None:
        self.limit = limit
        self.rate = limit / 60.0
        # At least one unit, so that a tiny limit can still admit something.
        self.capacity = max(1.0, self.rate * burst_seconds)
        self.level = self.capacity
        self.updated = now

    def refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_for(self, amount: float, now: float) -> float | None:
        """Seconds until ``amount`` fits (0 = now); ``None`` if it can never fit."""
        if amount > self.limit:
            return None
        self.refill(now)
        need = min(amount, self.capacity)
        if self.level >= need:
            return 0.0
        return (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount

    def spend_refused(self, amount: float) -> None:
        """A refused request still uses its slot; the debt is bounded by one burst."""
        self.level = max(-self.capacity, self.level - amount)

    def give_back(self, amount: float) -> None:
        self.level = min(self.capacity, self.level + amount)

    def remaining(self) -> int:
        """What can be spent now before being limited (what the providers' headers report)."""
        return max(0, math.floor(self.level))

    def seconds_to_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)


@dataclass(frozen=True, slots=True)
class TokenCharge:
    """The tokens a request is charged at admission, per dimension."""

    input: int  # against itpm
    output: int  # against otpm (Anthropic: an estimate, corrected at the end)
    total: int  # against tpm


def charge_of(profile: Profile, input_tokens: int, max_tokens: int, cache_read: int) -> TokenCharge:
    """What ``profile`` charges at admission for a request."""
    if profile == "openai":
        return TokenCharge(input=input_tokens, output=max_tokens, total=input_tokens + max_tokens)
    if profile == "anthropic":
        counted = max(0, input_tokens - cache_read)  # cache reads do not count toward ITPM
        return TokenCharge(input=counted, output=max_tokens, total=counted + max_tokens)
    return TokenCharge(input=input_tokens, output=0, total=input_tokens)
