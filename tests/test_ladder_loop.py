"""The degrade ladder in the loop, on the FakeProvider over real HTTP (virtual time).

Standard refuses with a wait past the deadline -> flex serves; flex is out of
capacity -> the fallback serves; bulk work reaches the batch rung and is handed
over; interactive work without a park rung fails at once; each outcome names its
rung and its cost, and the metrics and the task summary add the costs up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from rateloop import Limiter, Outcome, Policy, RateLoop, Route, Status
from rateloop.observe import PrometheusSink
from rateloop.testing import FakeClock, FakeLimits, FakeProvider, FakeProviderServer

MAIN = Route(provider="openai", model="gpt-big", project="p", input_price_per_mtok=2.0,
             output_price_per_mtok=8.0)
BACKUP = Route(provider="openai", model="gpt-small", project="q", input_price_per_mtok=0.4,
               output_price_per_mtok=1.6)
TOKENS = {"x-fake-input-tokens": "1000", "x-fake-output-tokens": "500"}
# 1000 input and 500 output tokens on MAIN at the standard tier: $0.002 + $0.004.
FULL_PRICE = 0.006


class Fleet:
    """Two OpenAI-shaped fakes over HTTP: MAIN's (standard and flex) and BACKUP's."""

    def __init__(self, clock: FakeClock, main: FakeProvider, backup: FakeProvider) -> None:
        self.clock, self.main, self.backup = clock, main, backup
        self.sent: list[tuple[str, str]] = []  # (model, tier) of every request sent

    def call(self, route: Route) -> httpx.Response:
        body: dict[str, Any] = {"model": route.model, "max_tokens": 500,
                                "messages": [{"role": "user", "content": "hi"}]}
        if route.tier == "flex":
            body["service_tier"] = "flex"  # the route carries the tier; the request says it
        self.sent.append((route.model, route.tier))
        client = self.http_backup if route.model == BACKUP.model else self.http_main
        return client.post("/v1/chat/completions", json=body, headers=TOKENS)


@pytest.fixture
def fleet() -> Iterator[Callable[..., Fleet]]:
    opened: list[Any] = []

    def make(*, main: FakeProvider, backup: FakeProvider | None = None) -> Fleet:
        clock = main.clock
        assert isinstance(clock, FakeClock)
        backup = backup or FakeProvider(rpm=600, clock=clock)
        f = Fleet(clock, main, backup)
        for name, fake in (("main", main), ("backup", backup)):
            server = FakeProviderServer(fake)
            server.__enter__()
            opened.append(server)
            http = httpx.Client(base_url=server.url, timeout=10.0)
            opened.append(http)
            setattr(f, f"http_{name}", http)
        return f

    yield make
    for thing in reversed(opened):
        if isinstance(thing, httpx.Client):
            thing.close()
        else:
            thing.__exit__(None, None, None)


def run(fleet: Fleet, ladder: dict[str, Any], *, priority: str, deadline: float | None = 30.0,
        fallbacks: tuple[Route, ...] = (), sinks: list[Any] | None = None,
        **policy: Any) -> Outcome:
    pol = Policy.from_dict({"ladder": ladder, **policy})
    loop = RateLoop(pol, clock=fleet.clock, limiter=Limiter(clock=fleet.clock), sinks=sinks or [])
    return loop.call(fleet.call, route=MAIN, priority=priority, deadline=deadline,
                     fallbacks=list(fallbacks))


def spend_standard(fleet: Fleet) -> None:
    """MAIN's standard tier serves one request a minute: take it, so the next waits ~60 s."""
    assert fleet.call(MAIN).status_code == 200
    assert fleet.call(MAIN).status_code == 429
    fleet.sent.clear()


def test_standard_wait_past_the_deadline_moves_to_flex_and_pays_half(
    fleet: Callable[..., Fleet],
) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=1, flex=FakeLimits(rpm=60), clock=clock))
    spend_standard(f)
    out = run(f, {"scheduled": ["standard", "flex", "fallback", "park"]}, priority="scheduled")
    assert out.status is Status.DEGRADED, out
    assert (out.rung, out.route, out.next_rung) == ("flex", MAIN.with_tier("flex"), None)
    assert f.sent == [("gpt-big", "standard"), ("gpt-big", "flex")]
    assert out.value.json()["service_tier"] == "flex"
    # From the usage the provider reported, at the flex tier's 50 % off.
    assert out.cost_usd == pytest.approx(FULL_PRICE / 2)
    assert clock.sleeps == []  # moved at once: the standard wait could not fit
    assert f.main.stats.flex_served == 1


def test_without_a_ladder_nothing_changes(fleet: Callable[..., Fleet]) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=1, flex=FakeLimits(rpm=60), clock=clock))
    spend_standard(f)
    out = run(f, {}, priority="scheduled", fallbacks=(BACKUP,))
    # Today's chain: the route, then its fallback; flex is never tried.
    assert (out.status, out.rung, out.route) == (Status.DEGRADED, "fallback", BACKUP)
    assert [tier for _, tier in f.sent] == ["standard", "standard"]
    assert out.cost_usd == pytest.approx((1000 * 0.4 + 500 * 1.6) / 1e6)


def test_flex_unavailable_falls_to_the_fallback(fleet: Callable[..., Fleet]) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=1, flex=FakeLimits(rpm=1), clock=clock))
    spend_standard(f)
    assert f.call(MAIN.with_tier("flex")).status_code == 200  # flex's one slot, spent
    f.sent.clear()
    out = run(f, {"scheduled": ["standard", "flex", "fallback", "park"]}, priority="scheduled",
              fallbacks=(BACKUP,), attempts_per_route=1)
    assert (out.status, out.rung, out.route) == (Status.DEGRADED, "fallback", BACKUP), out
    assert f.sent == [("gpt-big", "standard"), ("gpt-big", "flex"), ("gpt-small", "standard")]
    assert f.main.stats.flex_refused == 1
    assert [e.decision.value for e in out.events if e.decision.value == "fallback"] == [
        "fallback", "fallback"]


def test_a_flex_refusal_binds_only_the_flex_scope(fleet: Callable[..., Fleet]) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=600, flex=FakeLimits(rpm=1), clock=clock))
    assert f.call(MAIN.with_tier("flex")).status_code == 200
    limiter = Limiter(clock=clock)
    observed: list[str] = []
    real = limiter.observe

    def observe(scope: str, source: Any) -> None:
        observed.append(scope)
        real(scope, source)

    limiter.observe = observe  # type: ignore[method-assign]
    pol = Policy.from_dict({"ladder": {"background": ["flex", "standard"]},
                            "attempts_per_route": 1})
    loop = RateLoop(pol, clock=clock, limiter=limiter, sinks=[])
    out = loop.call(f.call, route=MAIN, priority="background", deadline=30)
    assert (out.status, out.rung) == (Status.DEGRADED, "standard")
    refused = [e for e in out.events if e.provider_code == "flex_unavailable"]
    assert refused and not [e for e in out.events if e.decision.value == "pause"]
    # The refusal was told to the flex scope; the standard scope only heard its own answer.
    assert observed == ["openai:gpt-big~flex:p", "openai:gpt-big:p"], observed


def test_bulk_work_reaching_batch_is_handed_over(fleet: Callable[..., Fleet]) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=1, flex=FakeLimits(rpm=60), clock=clock))
    spend_standard(f)
    out = run(f, {"background": ["standard", "batch", "fallback", "park"], "deferrable": []},
              priority="background", fallbacks=(BACKUP,))
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert (out.next_rung, out.rung, out.route) == ("batch", "batch", MAIN.with_tier("batch"))
    assert "batch" in out.reason and out.cost_usd is None
    assert f.sent == [("gpt-big", "standard")]  # nothing sent on the batch rung, no fallback


def test_deferrable_work_starts_on_its_cheapest_rung(fleet: Callable[..., Fleet]) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=600, flex=FakeLimits(rpm=60), clock=clock))
    out = run(f, {"background": ["standard", "flex", "batch", "park"]}, priority="background",
              deadline=None)
    assert (out.status, out.rung) == (Status.COMPLETED, "flex")
    assert f.sent == [("gpt-big", "flex")]
    # With the tiers at full price, flex is no cheaper: the ladder's order stands.
    f.sent.clear()
    out = run(f, {"background": ["standard", "flex"], "flex_discount": 0}, priority="background")
    assert (out.rung, f.sent) == ("standard", [("gpt-big", "standard")])
    assert out.cost_usd == pytest.approx(FULL_PRICE)


def test_interactive_without_park_fails_now_and_with_park_parks(
    fleet: Callable[..., Fleet],
) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=1, clock=clock))
    spend_standard(f)
    out = run(f, {"interactive": ["standard"]}, priority="interactive")
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert "interactive ladder (standard) has no park rung" in out.reason
    out = run(f, {"interactive": ["standard", "park"]}, priority="interactive")
    assert (out.status, out.next_rung) == (Status.WAITING_FOR_CAPACITY, "park")
    assert out.retry_at is not None


def test_the_metrics_sum_the_cost_by_rung(fleet: Callable[..., Fleet]) -> None:
    clock = FakeClock()
    f = fleet(main=FakeProvider(rpm=1, flex=FakeLimits(rpm=60), clock=clock))
    sink = PrometheusSink(clock=clock)
    ladder = {"scheduled": ["standard", "flex"]}
    run(f, ladder, priority="scheduled", sinks=[sink])  # standard serves
    run(f, ladder, priority="scheduled", sinks=[sink])  # standard waits 60 s: flex serves
    text = sink.exposition().decode()
    costs = {line.split("rung=\"")[1].split("\"")[0]: float(line.rsplit(" ", 1)[1])
             for line in text.splitlines() if line.startswith("rateloop_cost_usd_total{")}
    assert costs == pytest.approx({"standard": FULL_PRICE, "flex": FULL_PRICE / 2})
