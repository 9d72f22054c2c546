"""The arguments of the RATE loop, checked: wrong use is a ``TypeError`` that says what to pass.

``RateLoop("policy.toml")`` or ``sinks=LoggingSink()`` would otherwise fail
much later and far away (``AttributeError: 'str' object has no attribute
'fallback'``).  Every check here names the value it got and shows the call
that works instead.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict

from rateloop._clock import Clock
from rateloop.outcome.events import EventSink
from rateloop.policy import Policy
from rateloop.route import Cost, Priority, Route
from rateloop.signal import LimitSignal
from rateloop.timing.budget import RunBudget

__all__ = [
    "AsyncLimiter",
    "BlockingLimiter",
    "CallOptions",
    "CallSpec",
    "Classifier",
    "KeepReservation",
    "LoopOptions",
    "Priority",
    "call_spec",
    "check_classify",
    "check_clock",
    "check_keep_reservation",
    "check_limiter",
    "check_policy",
    "check_rng",
    "check_run",
    "check_sinks",
    "takes_call_labels",
]

class BlockingLimiter(Protocol):
    """What :class:`RateLoop` calls on any limiter (docs/loop.md, "The limiter contract")."""

    def try_reserve(self, route: Route, cost: Cost, *, priority: str) -> Any: ...
    def observe(self, scope: str, signal: LimitSignal) -> None: ...
    def pause(self, scope: str, until: datetime, reason: str) -> None: ...


class AsyncLimiter(Protocol):
    """What :class:`AsyncRateLoop` awaits on any limiter: the ``a``-prefixed twins."""

    async def atry_reserve(self, route: Route, cost: Cost, *, priority: str) -> Any: ...
    async def aobserve(self, scope: str, signal: LimitSignal) -> None: ...
    async def apause(self, scope: str, until: datetime, reason: str) -> None: ...


def _contract(protocol: type) -> tuple[str, ...]:
    return tuple(name for name, member in vars(protocol).items() if inspect.isfunction(member)
                 and not name.startswith("_"))


#: ``(exception) -> LimitSignal``: the loop's ``classify=`` hook.
Classifier = Callable[[BaseException], LimitSignal]

#: ``(fn, reservation) -> bool``: the loop's ``keep_reservation=`` hook.  Asked with the
#: attempt callable and the reservation of an attempt that succeeded, before the loop
#: settles it; True means the hook took the reservation over (and settles or releases
#: it later itself: a response stream does when it closes).
KeepReservation = Callable[[Callable[..., Any], Any], bool]


class LoopOptions(TypedDict, total=False):
    """The arguments of :class:`RateLoop` (all optional), as :meth:`RateLoop.like` takes them."""

    policy: Policy | None
    limiter: Any
    clock: Clock | None
    sinks: Sequence[EventSink] | None
    classify: Classifier | None
    run_budget: RunBudget | None
    run_id: str | None
    rng: Callable[[], float] | None
    keep_reservation: KeepReservation | None


class CallOptions(TypedDict, total=False):
    """The keyword options of :meth:`RateLoop.call` (all optional)."""

    cost: Cost | Mapping[str, int] | None
    operation: str
    idempotent: bool
    idempotency_key: str | None
    outcome_check: Callable[[Route], Any] | None
    deadline: datetime | float | None
    fallbacks: Sequence[Route] | None
    priority: Priority | str
    data_class: str | None
    task_id: str | None
    booked: Any


_OPTION_NAMES = frozenset(CallOptions.__annotations__)
_PRIORITIES = frozenset(p.value for p in Priority)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSpec:
    """One call's arguments, checked, as the generator and the drivers see them."""

    route: Route
    fallbacks: tuple[Route, ...]
    cost: Cost
    operation: str
    idempotent: bool
    fn_kwargs: dict[str, Any]
    outcome_check: Callable[[Route], Any] | None
    deadline: datetime | None
    priority: Priority
    data_class: str | None
    task_id: str | None
    #: A reservation granted before the call (a start an earlier engine attempt booked):
    #: the first admission on its route takes it instead of asking the limiter.
    booked: Any = None


def _name(value: object) -> str:
    return type(value).__name__


def check_policy(policy: object) -> Policy:
    if policy is None:
        return Policy()
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str) or hasattr(policy, "__fspath__"):
        raise TypeError(
            f"policy must be a rateloop.Policy, got the path {str(policy)!r}; "
            f"load it first: RateLoop(Policy.from_file({str(policy)!r}))"
        )
    if isinstance(policy, Mapping):
        raise TypeError(
            "policy must be a rateloop.Policy, got a dict; build one with "
            "RateLoop(Policy.from_dict({...}))"
        )
    raise TypeError(f"policy must be a rateloop.Policy or None, got {_name(policy)} {policy!r}")


def check_limiter(limiter: object, *, is_async: bool = False) -> Any:
    if limiter is None:
        return None
    if isinstance(limiter, str):
        raise TypeError(
            f"limiter must be a rateloop.Limiter, got the URL {limiter!r}; "
            f"build one: RateLoop(policy, limiter=Limiter.from_url({limiter!r})) "
            "or limiter=Limiter.from_policy(policy)"
        )
    # Each twin needs only its own half of the contract (a test double may have one).
    needed = _contract(AsyncLimiter if is_async else BlockingLimiter)
    missing = [m for m in needed if not callable(getattr(limiter, m, None))]
    if missing:
        raise TypeError(
            f"limiter must be a rateloop.Limiter (or have its methods {', '.join(missing)}), "
            f"got {_name(limiter)}; build one with Limiter.from_policy(policy)"
        )
    return limiter


def check_sinks(sinks: object) -> tuple[Callable[..., None], ...]:
    if isinstance(sinks, str | bytes) or not isinstance(sinks, Iterable) or callable(sinks):
        if callable(sinks):
            raise TypeError(
                f"sinks takes a list of sinks, got one {_name(sinks)}; "
                f"pass sinks=[{_name(sinks)}(...)]"
            )
        raise TypeError(f"sinks must be a list of callables, got {_name(sinks)} {sinks!r}")
    out = tuple(sinks)
    for i, sink in enumerate(out):
        if not callable(sink):
            raise TypeError(
                f"sinks[{i}] must be a callable taking a CapacityEvent, got {_name(sink)} {sink!r}"
            )
    return out


def check_clock(clock: object, *, is_async: bool = False) -> None:
    needed = ("monotonic", "now", "asleep" if is_async else "sleep")
    missing = [m for m in needed if not callable(getattr(clock, m, None))]
    if missing:
        raise TypeError(
            f"clock must have {', '.join(m + '()' for m in needed)} (missing "
            f"{', '.join(missing)}), got {_name(clock)}; use rateloop.testing.FakeClock in tests"
        )


def check_rng(rng: object) -> None:
    if rng is not None and not callable(rng):
        raise TypeError(f"rng must be a callable returning a float in [0, 1), got {rng!r}")


def check_classify(classify: object) -> None:
    if classify is not None and not callable(classify):
        raise TypeError(
            f"classify must be a callable (exception) -> LimitSignal, got {_name(classify)}"
        )


def check_keep_reservation(hook: object) -> None:
    if hook is not None and not callable(hook):
        raise TypeError(
            "keep_reservation must be a callable (fn, reservation) -> bool, "
            f"got {_name(hook)} {hook!r}"
        )


def check_run(run_budget: object, run_id: object) -> None:
    if run_budget is not None and not isinstance(run_budget, RunBudget):
        raise TypeError(
            f"run_budget must be a rateloop.RunBudget, got {_name(run_budget)}; "
            f"e.g. run_budget=RunBudget({run_budget!r})"
            if isinstance(run_budget, int)
            else f"run_budget must be a rateloop.RunBudget, got {_name(run_budget)}"
        )
    if run_id is not None and not isinstance(run_id, str):
        raise TypeError(f"run_id must be a string, got {_name(run_id)} {run_id!r}")


def _cost(cost: object) -> Cost:
    if cost is None:
        return Cost()
    if isinstance(cost, Cost):
        return cost
    if isinstance(cost, Mapping):
        allowed = ("requests", "input_tokens", "output_tokens")
        unknown = sorted(str(k) for k in cost if k not in allowed)
        if unknown:
            raise TypeError(
                f"cost has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
            )
        return Cost(**{str(k): v for k, v in cost.items()})
    raise TypeError(
        f"cost must be a rateloop.Cost (or a dict of its fields), got {_name(cost)} {cost!r}; "
        "e.g. cost=Cost(input_tokens=1000, output_tokens=500)"
    )


def _fallbacks(fallbacks: object, default: tuple[Route, ...]) -> tuple[Route, ...]:
    if fallbacks is None:
        return default
    if isinstance(fallbacks, Route):
        raise TypeError(
            "fallbacks takes a list of routes, got one Route; pass fallbacks=[Route(...)]"
        )
    if isinstance(fallbacks, str | bytes) or not isinstance(fallbacks, Sequence):
        raise TypeError(f"fallbacks must be a list of Route values, got {fallbacks!r}")
    for i, route in enumerate(fallbacks):
        if not isinstance(route, Route):
            raise TypeError(f"fallbacks[{i}] must be a rateloop.Route, got {route!r}")
    return tuple(fallbacks)


def call_spec(policy: Policy, clock: Clock, route: object, options: Mapping[str, Any]) -> CallSpec:
    """The checked spec of one call, or a ``TypeError``/``ValueError`` naming the bad value."""
    unknown = set(options) - _OPTION_NAMES
    if unknown:
        raise TypeError(
            f"unknown call option(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(_OPTION_NAMES))}"
        )
    if not isinstance(route, Route):
        raise TypeError(f"route must be a rateloop.Route, got {route!r}")
    priority = options.get("priority", Priority.INTERACTIVE)
    if not isinstance(priority, str) or priority not in _PRIORITIES:
        allowed = ", ".join(repr(p.value) for p in Priority)
        raise ValueError(f"priority must be one of {allowed}, got {priority!r}")
    deadline = options.get("deadline")
    if isinstance(deadline, int | float) and not isinstance(deadline, bool):
        deadline = clock.now() + timedelta(seconds=float(deadline))
    elif deadline is not None and (not isinstance(deadline, datetime) or deadline.tzinfo is None):
        raise ValueError(
            f"deadline must be an aware datetime or seconds from now, got {deadline!r}"
        )
    key = options.get("idempotency_key")
    booked = options.get("booked")
    if booked is not None and not isinstance(getattr(booked, "route", None), Route):
        raise TypeError(
            f"booked must be a reservation (with its .route), got {_name(booked)} {booked!r}"
        )
    return CallSpec(
        route=route,
        fallbacks=_fallbacks(options.get("fallbacks"), policy.fallback.routes),
        cost=_cost(options.get("cost")),
        operation=options.get("operation", "model.generate"),
        idempotent=options.get("idempotent", True),
        fn_kwargs={"idempotency_key": key} if key is not None else {},
        outcome_check=options.get("outcome_check"),
        deadline=deadline,
        priority=Priority(priority),
        data_class=options.get("data_class"),
        task_id=options.get("task_id"),
        booked=booked,
    )


def takes_call_labels(hook: object) -> bool:
    """True when a sink's ``call_started`` accepts ``operation=`` and ``priority=``."""
    if not callable(hook):
        return False
    try:
        params = inspect.signature(hook).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: call it the old way
        return False
    names = {p.name for p in params}
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params) or {
        "operation",
        "priority",
    } <= names
