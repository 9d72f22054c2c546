"""The loop's public hooks: ``keep_reservation=`` and a loop derived with ``like``/``replace``.

An edge (the httpx transport) customises the loop through these, never by
overriding a private method or patching an attribute.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from _http_faults import throttle
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.loop.effects import (
    Book,
    Call,
    Effect,
    Observe,
    OutcomeCheck,
    Pause,
    Release,
    Reserve,
    Settle,
    SettleUsage,
    Sleep,
)
from rateloop.outcome import Status
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal
from rateloop.testing import FakeClock, FaultScript

ROUTE = Route(provider="openai", model="gpt-5")
COST = Cost(input_tokens=100, output_tokens=50)


class Held:
    """A reservation that records what was done with it."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def settle(self, input_tokens: int, output_tokens: int) -> None:
        self.log.append(f"settle {input_tokens} {output_tokens}")

    def settle_usage(self, usage: Any) -> None:
        self.log.append("settle_usage")

    def release(self) -> None:
        self.log.append("release")

    async def asettle(self, input_tokens: int, output_tokens: int) -> None:
        self.settle(input_tokens, output_tokens)

    async def asettle_usage(self, usage: Any) -> None:
        self.settle_usage(usage)

    async def arelease(self) -> None:
        self.release()


class Recorder:
    """A limiter double with both halves of the contract; it admits everything."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.granted: list[Held] = []

    def try_reserve(self, route: Route, cost: Cost, *, priority: str) -> Held:
        self.log.append(f"reserve {route.scope}")
        held = Held(self.log)
        self.granted.append(held)
        return held

    def observe(self, scope: str, signal: LimitSignal) -> None:
        self.log.append(f"observe {scope}")

    def pause(self, scope: str, until: Any, reason: str) -> None:
        self.log.append(f"pause {scope}")

    async def atry_reserve(self, route: Route, cost: Cost, *, priority: str) -> Held:
        return self.try_reserve(route, cost, priority=priority)

    async def aobserve(self, scope: str, signal: LimitSignal) -> None:
        self.observe(scope, signal)

    async def apause(self, scope: str, until: Any, reason: str) -> None:
        self.pause(scope, until, reason)


class Keeper:
    """A ``keep_reservation`` hook that keeps what ``answer`` says, recording what it was asked."""

    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked: list[tuple[object, object]] = []

    def __call__(self, fn: object, reservation: object) -> bool:
        self.asked.append((fn, reservation))
        return self.answer


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(True, ["reserve openai:gpt-5"], id="kept-not-settled"),
        pytest.param(False, ["reserve openai:gpt-5", "settle 100 50"], id="declined-settled"),
    ],
)
def test_keep_reservation_is_asked_before_a_success_is_settled(
    answer: bool, expected: list[str]
) -> None:
    limiter, keeper = Recorder(), Keeper(answer)
    loop = RateLoop(limiter=limiter, clock=FakeClock(), sinks=[], keep_reservation=keeper)
    fn = FaultScript(["ok"])
    outcome = loop.call(fn, route=ROUTE, cost=COST)
    assert outcome.status is Status.COMPLETED
    assert expected == limiter.log
    assert [(fn, limiter.granted[0])] == keeper.asked


def test_a_refused_attempt_is_released_without_asking_the_hook() -> None:
    limiter, keeper = Recorder(), Keeper(True)
    once = Policy(max_attempts=1)
    loop = RateLoop(once, limiter=limiter, clock=FakeClock(), sinks=[], keep_reservation=keeper)
    outcome = loop.call(FaultScript([throttle("1")]), route=ROUTE, cost=COST)
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    expected = ["reserve openai:gpt-5", "release", "observe openai:gpt-5", "pause openai:gpt-5"]
    assert expected == limiter.log
    assert not keeper.asked


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(True, ["reserve openai:gpt-5"], id="kept"),
        pytest.param(False, ["reserve openai:gpt-5", "settle 100 50"], id="declined"),
    ],
)
def test_the_async_twin_asks_the_same_hook(answer: bool, expected: list[str]) -> None:
    limiter, keeper = Recorder(), Keeper(answer)
    loop = AsyncRateLoop(limiter=limiter, clock=FakeClock(), sinks=[], keep_reservation=keeper)

    async def fn(route: Route) -> str:
        return "ok"

    outcome = asyncio.run(loop.call(fn, route=ROUTE, cost=COST))
    assert outcome.ok
    assert expected == limiter.log
    assert len(keeper.asked) == 1


def test_keep_reservation_must_be_callable() -> None:
    with pytest.raises(TypeError, match="keep_reservation must be a callable"):
        RateLoop(keep_reservation="yes")  # type: ignore[arg-type]


# -- deriving a loop ---------------------------------------------------------------------


def _built() -> RateLoop:
    return RateLoop(
        Policy(max_attempts=3),
        limiter=Recorder(),
        clock=FakeClock(),
        sinks=[print],
        classify=lambda error: LimitSignal.of(Kind.TEMPORARY),
        run_id="run-1",
        rng=lambda: 0.5,
        keep_reservation=Keeper(True),
    )


def test_replace_changes_only_what_it_is_given() -> None:
    loop = _built()
    strict = Policy(max_attempts=1)
    derived = loop.replace(policy=strict)
    assert type(derived) is RateLoop and derived is not loop
    assert {**loop.options(), "policy": strict} == derived.options()


def test_like_turns_a_blocking_loop_into_its_async_twin() -> None:
    loop = _built()
    twin = AsyncRateLoop.like(loop)
    assert type(twin) is AsyncRateLoop
    assert loop.options() == twin.options()


def test_like_takes_a_loop() -> None:
    with pytest.raises(TypeError, match="like\\(\\) takes a RateLoop or AsyncRateLoop"):
        RateLoop.like(Policy())  # type: ignore[arg-type]


def test_a_derived_loop_keeps_checking_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"policy must be a rateloop\.Policy"):
        _built().replace(policy="policy.toml")  # type: ignore[typeddict-item]


# -- the vocabulary is closed and typed --------------------------------------------------


def test_the_effects_are_the_closed_vocabulary() -> None:
    members = set(Effect.__args__)  # type: ignore[attr-defined]
    expected = {
        Reserve, Book, Release, Settle, SettleUsage, Observe, Pause, Call, Sleep, OutcomeCheck
    }
    assert expected == members
    # No effect names a method to call: each is performed by its type.
    assert not [m for m in members if "method" in m.__dataclass_fields__]


@pytest.mark.parametrize("is_async", [False, True])
def test_the_transport_runs_a_plain_loop_with_the_public_hook(is_async: bool) -> None:
    httpx_integration = pytest.importorskip("rateloop.integrations.httpx")
    name = "AsyncRateLoopTransport" if is_async else "RateLoopTransport"
    given = _built()
    transport = getattr(httpx_integration, name)(loop=given)
    assert type(transport.loop) is (AsyncRateLoop if is_async else RateLoop)
    assert transport.loop.keep_reservation is not None
    assert transport.loop.rng is given.rng and transport.loop.limiter is given.limiter
    assert transport.policy.max_error_attempts == 5  # the transport's own error bound
