"""Time: how long to wait before the next attempt, and whether that wait fits.

How it works.  :class:`Backoff` turns a retry index ``n`` (1 is the wait
before the second execution) into seconds in three steps:

1. :meth:`Backoff.base` — the strategy's formula, capped at ``max_delay``.
   The formulas saturate: the exponent is compared in log space before any
   power is taken, so ``n = 10**9`` returns the cap, never ``inf`` and never
   an ``OverflowError``.
2. :meth:`Backoff.delay` — jitter spreads the base so that many clients
   refused at once do not return at once: ``none`` d, ``equal``
   ``d·(0.5 + 0.5·r)``, ``full`` ``d·r`` with ``r`` from the injected
   random source.
3. :meth:`Backoff.wait` — a server minimum (``Retry-After``) is a floor
   that is never shortened: ``max(local, m) + U(0, local/2)``.  The extra
   half-spread keeps a fleet that got the same ``Retry-After`` from
   returning in the same instant.

:func:`plan_wait` then checks a wait against the pause limit and the time
left in the budget (see :class:`rateloop.timing.budget.CallBudget`) and returns a
:class:`WaitPlan`: wait this long, or stop and come back at ``retry_after``.

Bounds of one wait, with ``[lo, hi] = Backoff.bounds(n)``: without a server
minimum ``lo <= wait <= hi``; with a minimum ``m`` ``max(lo, m) <= wait <=
max(hi, m) + hi/2``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args

__all__ = ["Backoff", "BackoffSettings", "Jitter", "Strategy", "WaitPlan", "plan_wait"]

Strategy = Literal["exponential", "linear", "constant", "decorrelated"]
Jitter = Literal["none", "equal", "full"]

STRATEGIES: tuple[str, ...] = get_args(Strategy)
JITTERS: tuple[str, ...] = get_args(Jitter)


class BackoffSettings(Protocol):
    """What :meth:`Backoff.from_policy` reads (a :class:`~rateloop.policy.Policy` has it)."""

    @property
    def strategy(self) -> Strategy: ...
    @property
    def initial_delay_secs(self) -> float: ...
    @property
    def max_delay_secs(self) -> float: ...
    @property
    def multiplier(self) -> float: ...
    @property
    def jitter(self) -> Jitter: ...


#: Decorrelated backoff draws the next wait from U(initial, previous·3).
_DECORRELATED_GROWTH = 3.0


def _number(name: str, value: object, *, minimum: float, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"Backoff {name} must be a number, got {value!r} (allowed: {allowed})")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"Backoff {name} must be {allowed}, got an integer too large") from None
    if math.isnan(number) or math.isinf(number) or number < minimum:
        raise ValueError(f"Backoff {name} must be {allowed}, got {value!r}")
    return number


def _retry_index(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"retry index must be an int >= 1 (1 is the wait before the second attempt), got {n!r}"
        )
    return n


def _grown(initial: float, factor: float, exponent: int, cap: float) -> float:
    """``min(initial·factor^exponent, cap)`` without overflow for any exponent."""
    if initial <= 0.0:
        return 0.0
    if initial >= cap:
        return cap
    if factor <= 1.0 or exponent <= 0:
        return initial
    # Decide in log space before any power is taken (cap/initial itself may overflow
    # for a subnormal initial, so the logs are taken apart).
    log_growth = exponent * math.log(factor)
    if log_growth >= math.log(cap) - math.log(initial):
        return cap
    if log_growth < 700.0:  # factor**exponent is finite: keep exact products (2·2^2 == 8)
        return min(initial * factor**exponent, cap)
    return min(math.exp(math.log(initial) + log_growth), cap)


def _fmt(seconds: float) -> str:
    return f"{seconds:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """A backoff schedule: strategy, base delay, cap, growth and jitter.

    ``rng`` returns a float in [0, 1) (``random.random`` by default); inject
    a fixed source in tests.  ``initial=0`` is allowed here (every wait is 0:
    instant retries for tests); a loaded :class:`~rateloop.policy.Policy`
    requires at least 1 s.  When ``initial > max_delay`` the cap wins.
    """

    strategy: Strategy = "exponential"
    initial: float = 5.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    jitter: Jitter = "equal"
    rng: Callable[[], float] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"Backoff strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}"
            )
        if self.jitter not in JITTERS:
            raise ValueError(
                f"Backoff jitter must be one of {', '.join(JITTERS)}, got {self.jitter!r}"
            )
        object.__setattr__(
            self, "initial", _number("initial", self.initial, minimum=0.0, allowed="finite >= 0")
        )
        object.__setattr__(
            self,
            "max_delay",
            _number("max_delay", self.max_delay, minimum=0.0, allowed="finite >= 0"),
        )
        object.__setattr__(
            self,
            "multiplier",
            _number("multiplier", self.multiplier, minimum=1.0, allowed="finite >= 1"),
        )
        if self.rng is not None and not callable(self.rng):
            raise ValueError(f"Backoff rng must be a callable returning [0, 1), got {self.rng!r}")

    @classmethod
    def from_policy(
        cls, policy: BackoffSettings, rng: Callable[[], float] | None = None
    ) -> Backoff:
        """The backoff a :class:`~rateloop.policy.Policy` configures."""
        return cls(
            strategy=policy.strategy,
            initial=policy.initial_delay_secs,
            max_delay=policy.max_delay_secs,
            multiplier=policy.multiplier,
            jitter=policy.jitter,
            rng=rng,
        )

    # -- the formula -----------------------------------------------------

    def _random(self) -> float:
        r = float((self.rng or random.random)())
        if not 0.0 <= r <= 1.0:  # also rejects NaN
            raise ValueError(f"Backoff rng returned {r!r}; it must return a number in [0, 1)")
        return r

    def base(self, n: int, previous: float | None = None) -> float:
        """The un-jittered wait before retry ``n``, capped at ``max_delay``.

        ``previous`` is the wait taken before retry ``n - 1``; only the
        decorrelated strategy uses it (it defaults to ``initial``), and that
        strategy draws from the random source itself.
        """
        n = _retry_index(n)
        cap = self.max_delay
        if self.strategy == "exponential":
            return _grown(self.initial, self.multiplier, n - 1, cap)
        if self.strategy == "linear":
            if self.initial <= 0.0:
                return 0.0
            # Compare before multiplying: an int n of any size never overflows here.
            return cap if n >= cap / self.initial else min(self.initial * n, cap)
        if self.strategy == "constant":
            return min(self.initial, cap)
        prev = self.initial if previous is None else previous
        if isinstance(prev, bool) or not isinstance(prev, int | float) or not prev >= 0.0:
            raise ValueError(f"previous wait must be a number >= 0, got {previous!r}")
        low = min(self.initial, cap)
        high = max(low, min(float(prev), cap) * _DECORRELATED_GROWTH)
        return min(cap, low + (high - low) * self._random())

    def _jittered(self, d: float, r: float) -> float:
        if self.jitter == "none":
            return d
        if self.jitter == "equal":
            return d * (0.5 + 0.5 * r)
        return d * r

    def delay(self, n: int, previous: float | None = None) -> float:
        """:meth:`base` with jitter applied (``none`` d, ``equal`` U(d/2, d), ``full`` U(0, d))."""
        d = self.base(n, previous)
        if self.jitter == "none":
            return d
        return self._jittered(d, self._random())

    def bounds(self, n: int) -> tuple[float, float]:
        """The range of :meth:`delay` at retry ``n``, jitter included.

        For the decorrelated strategy the upper end assumes ``previous`` was
        the wait actually taken before (so it grows at most 3× per retry).
        """
        n = _retry_index(n)
        if self.strategy == "decorrelated":
            low = min(self.initial, self.max_delay)
            high = _grown(low, _DECORRELATED_GROWTH, n, self.max_delay)
        else:
            low = high = self.base(n)
        return self._jittered(low, 0.0), self._jittered(high, 1.0)

    def wait(
        self, n: int, server_minimum: float | None = None, previous: float | None = None
    ) -> float:
        """The wait before retry ``n``, honouring a server minimum as a floor.

        With a minimum ``m > 0``: ``max(local, m) + U(0, local/2)``, where
        ``local = delay(n)``.  The minimum is never shortened.
        """
        local = self.delay(n, previous)
        m = _server_minimum(server_minimum)
        if m is None:
            return local
        return max(local, m) + self._random() * local / 2.0

    # -- description -----------------------------------------------------

    @property
    def formula(self) -> str:
        """The un-jittered formula in retry index ``n``, e.g. ``"5·2^(n−1)"``."""
        return self.formula_at(None)

    def formula_at(self, n: int | None) -> str:
        """The formula with retry index ``n`` filled in (``"5·2^3"``), or symbolic for None."""
        i, m = _fmt(self.initial), _fmt(self.multiplier)
        if self.strategy == "exponential":
            return f"{i}·{m}^{'(n−1)' if n is None else n - 1}"
        if self.strategy == "linear":
            return f"{i}·{'n' if n is None else n}"
        if self.strategy == "constant":
            return i
        return f"U({i}, 3·previous)"

    def describe(self) -> str:
        """One line for humans: ``exponential 5·2^(n−1) s, capped at 60 s, equal jitter``."""
        return (
            f"{self.strategy} {self.formula} s, capped at {_fmt(self.max_delay)} s, "
            f"{self.jitter} jitter"
        )


def _server_minimum(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"server minimum must be a number of seconds or None, got {value!r}")
    return float(value) if value > 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitPlan:
    """What to do about one wait.

    ``fits`` True: sleep ``seconds``, then retry.  ``fits`` False: do not
    wait here; stop (or checkpoint) and retry no sooner than ``retry_after``
    seconds from now.  ``retry_after`` is the server minimum when there is
    one, else the planned wait.  ``reason`` says why a wait does not fit, or
    why it was shortened; it is None for an ordinary wait.
    """

    seconds: float
    fits: bool
    reason: str | None
    retry_after: float

    def __repr__(self) -> str:
        verdict = "fits" if self.fits else "does not fit"
        text = f"WaitPlan({self.seconds:g}s, {verdict}, retry_after={self.retry_after:g}s"
        return text + (f", reason={self.reason!r})" if self.reason else ")")


def plan_wait(
    backoff: Backoff,
    n: int,
    *,
    server_minimum: float | None,
    pause_limit: float,
    time_left: float | None,
    previous: float | None = None,
) -> WaitPlan:
    """Plan the wait before retry ``n`` within the pause limit and the time left.

    Rules, in order:

    * a server minimum beyond ``pause_limit`` does not fit: holding a
      process that long is worse than stopping and coming back;
    * a server minimum beyond ``time_left`` (the recovery budget or the
      deadline, None = unbounded) does not fit;
    * a wait whose jittered total would exceed the smaller of the two is
      shortened — only its spread, never below the floor — when the floor
      still fits, and otherwise does not fit.  The floor is the server
      minimum when there is one (the server said when capacity returns; our
      own backoff is only a guess and a spread); without one it is the least
      the configured jitter could have drawn (``bounds(n)[0]``), so a
      shortened wait is still a wait the jitter could have produced.  With
      ``jitter="none"`` nothing is ever shortened.
    """
    limit = _number("pause_limit", pause_limit, minimum=0.0, allowed="finite >= 0")
    left = None if time_left is None else float(time_left)
    if left is not None and math.isnan(left):
        raise ValueError("time_left must be a number of seconds or None, got nan")
    m = _server_minimum(server_minimum)
    if m is not None and m > limit:
        return WaitPlan(
            seconds=m,
            fits=False,
            reason=f"server asked for {m:g}s, beyond the pause limit of {limit:g}s",
            retry_after=m,
        )
    if m is not None and left is not None and m > left:
        return WaitPlan(
            seconds=m,
            fits=False,
            reason=f"server asked for {m:g}s, beyond the {max(left, 0.0):g}s left in the budget",
            retry_after=m,
        )
    planned = backoff.wait(n, m, previous)
    ceiling = limit if left is None else min(limit, left)
    if planned <= ceiling:
        return WaitPlan(seconds=planned, fits=True, reason=None, retry_after=m or planned)
    floor = m if m is not None else backoff.bounds(n)[0]
    if floor <= ceiling:
        return WaitPlan(
            seconds=ceiling,
            fits=True,
            reason=f"wait shortened from {planned:g}s to {ceiling:g}s to fit",
            retry_after=m or ceiling,
        )
    what = "the pause limit of" if left is None or limit <= left else "the time left,"
    return WaitPlan(
        seconds=planned,
        fits=False,
        reason=f"a backoff of at least {floor:g}s is beyond {what} {max(ceiling, 0.0):g}s",
        retry_after=planned,
    )
