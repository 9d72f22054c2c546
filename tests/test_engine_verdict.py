"""The one mapping every engine integration shares: Outcome -> Finish / RetryLater / GiveUp."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rateloop import Policy, RateLoop, Route
from rateloop.integrations._engine import (
    Finish,
    GiveUp,
    RetryLater,
    engine_run_budget,
    verdict,
)
from rateloop.outcome import Outcome, Status

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.DEGRADED])
def test_done_work_finishes_and_degraded_is_marked(status: Status) -> None:
    v = verdict(Outcome(status=status, reason="r", value=42), now=NOW)
    assert isinstance(v, Finish)
    assert v.value == 42 and v.degraded is (status is Status.DEGRADED)


@pytest.mark.parametrize("status", [Status.WAITING_FOR_RESET, Status.WAITING_FOR_CAPACITY])
def test_waits_go_back_to_the_engine_until_retry_at(status: Status) -> None:
    v = verdict(Outcome(status=status, reason="wait", retry_at=NOW + timedelta(seconds=90)),
                now=NOW)
    assert isinstance(v, RetryLater)
    assert v.delay_secs == 90.0 and v.status == status.value and v.reason == "wait"


def test_a_reset_already_due_is_retried_after_the_floor_not_at_once() -> None:
    past = Outcome(status=Status.WAITING_FOR_RESET, reason="w", retry_at=NOW - timedelta(1))
    assert verdict(past, now=NOW) == RetryLater(1.0, "w", "waiting_for_reset", past)
    no_time = Outcome(status=Status.WAITING_FOR_CAPACITY, reason="w")
    v = verdict(no_time, now=NOW, min_delay_secs=3.0)
    assert isinstance(v, RetryLater) and v.delay_secs == 3.0


@pytest.mark.parametrize("status", [Status.NEEDS_OPERATOR, Status.INVALID, Status.REJECTED,
                                    Status.FAILED_RETRY_EXHAUSTED])
def test_terminal_outcomes_give_up_with_reason_and_original_error(status: Status) -> None:
    error = ValueError("the provider said no")
    v = verdict(Outcome(status=status, reason="because", error=error), now=NOW)
    assert isinstance(v, GiveUp)
    assert (v.status, v.reason, v.error) == (status.value, "because", error)


def test_every_status_has_a_verdict() -> None:
    for status in Status:
        verdict(Outcome(status=status, reason="r"), now=NOW)


def test_engine_attempts_count_against_the_policy_budget() -> None:
    policy = Policy.from_dict({"max_attempts": 3})
    route = Route(provider="openai", model="m")
    calls: list[Route] = []

    def fn(r: Route) -> str:
        calls.append(r)
        return "ok"

    spent = RateLoop(policy, sinks=[]).replace(
        run_budget=engine_run_budget(policy, prior_attempts=3))
    outcome = spent.call(fn, route=route)
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED and calls == []
    left = RateLoop(policy, sinks=[]).replace(
        run_budget=engine_run_budget(policy, prior_attempts=2))
    assert left.call(fn, route=route).status is Status.COMPLETED and len(calls) == 1


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_prior_attempts_must_be_a_count(bad: object) -> None:
    with pytest.raises(ValueError, match="prior_attempts must be an int >= 0"):
        engine_run_budget(Policy(), prior_attempts=bad)  # type: ignore[arg-type]
