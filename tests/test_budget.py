"""Attempt and time budgets, sans-IO, driven by a FakeClock (no sleeping)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rateloop import outcome
from rateloop.testing import FakeClock
from rateloop.timing import budget
from rateloop.timing.backoff import Backoff, plan_wait
from rateloop.timing.budget import CallBudget, RunBudget


def test_attempt_ledger_is_reexported_not_redefined() -> None:
    assert budget.AttemptLedger is outcome.AttemptLedger
    assert budget.Attempts is outcome.Attempts


def test_run_budget_counts_and_refuses() -> None:
    run = RunBudget(3)
    assert run.try_spend(2)
    assert not run.try_spend(2)  # all or none
    assert (run.used, run.remaining, run.exhausted) == (2, 1, False)
    assert run.try_spend()
    assert not run.try_spend()
    assert (run.used, run.remaining, run.exhausted) == (3, 0, True)
    assert repr(run) == "RunBudget(used=3, max_attempts=3)"


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, None])
def test_run_budget_rejects_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match=r"int >= 1"):
        RunBudget(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"int >= 1"):
        RunBudget(5).try_spend(bad)  # type: ignore[arg-type]


def test_run_budget_is_thread_safe() -> None:
    run = RunBudget(1000)
    granted: list[int] = []

    def spend() -> None:
        granted.append(sum(run.try_spend() for _ in range(500)))

    threads = [threading.Thread(target=spend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 1000
    assert run.used == 1000


def test_call_budget_counts_the_first_attempt() -> None:
    b = CallBudget(max_attempts=3, recovery_budget_secs=600, started_at=0)
    assert [b.record_attempt() for _ in range(4)] == [True, True, True, False]
    assert b.attempts == 3
    assert not b.can_attempt()


def test_resetting_per_call_counters_still_stops_at_the_run_budget() -> None:
    run = RunBudget(50)
    granted = 0
    for _call in range(100):
        b = CallBudget(max_attempts=3, recovery_budget_secs=600, started_at=0, run=run)
        for _step in range(1000):
            if not b.record_attempt():
                break
            granted += 1
            b.reset_step()  # a success after every attempt: the per-step count restarts
    assert granted == 50
    fresh = CallBudget(max_attempts=3, recovery_budget_secs=600, started_at=0, run=run)
    assert not fresh.can_attempt()
    assert not fresh.record_attempt()


def test_many_calls_share_the_run_budget() -> None:
    run = RunBudget(10)
    per_call = []
    for _ in range(6):
        b = CallBudget(max_attempts=3, recovery_budget_secs=600, started_at=0, run=run)
        while b.record_attempt():
            pass
        per_call.append(b.attempts)
    assert per_call == [3, 3, 3, 1, 0, 0]


def test_recovery_clock_starts_at_first_refusal() -> None:
    b = CallBudget(max_attempts=5, recovery_budget_secs=600, started_at=100)
    assert b.time_left(5000) is None  # no refusal yet: nothing bounds it
    b.record_refusal(1000)
    b.record_refusal(1100)  # later refusals do not restart the clock
    assert b.first_refusal_at == 1000
    assert b.time_left(1100) == 500
    assert b.fits(1100, 500)
    assert not b.fits(1100, 500.5)
    assert b.time_left(1700) == -100
    b.reset_step()
    assert b.first_refusal_at is None


def test_deadline_and_max_wait_bound_time_left() -> None:
    b = CallBudget(
        max_attempts=5, recovery_budget_secs=600, started_at=100, deadline=400, max_wait_secs=250
    )
    assert b.time_left(200) == 150  # max_wait: 250 - (200 - 100)
    b2 = CallBudget(max_attempts=5, recovery_budget_secs=600, started_at=100, deadline=300)
    assert b2.time_left(200) == 100
    b2.record_refusal(250)
    assert b2.time_left(260) == 40
    assert "deadline=300" in repr(b2)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"recovery_budget_secs": -1}, "recovery_budget_secs"),
        ({"recovery_budget_secs": "600"}, "recovery_budget_secs"),
        ({"started_at": None}, "started_at"),
        ({"deadline": float("nan")}, "deadline"),
        ({"run": 5}, "RunBudget"),
    ],
)
def test_call_budget_rejects_bad_arguments(kwargs: dict[str, object], needle: str) -> None:
    args: dict[str, object] = {"max_attempts": 3, "recovery_budget_secs": 600, "started_at": 0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        CallBudget(**args)  # type: ignore[arg-type]


@given(
    initial=st.floats(0, 120),
    cap=st.floats(0, 600),
    jitter=st.sampled_from(["none", "equal", "full"]),
    strategy=st.sampled_from(["exponential", "linear", "constant", "decorrelated"]),
    recovery=st.floats(1, 3600),
    minimums=st.lists(st.one_of(st.none(), st.floats(0, 400)), min_size=1, max_size=30),
    work=st.floats(0, 30),
    r=st.floats(0, 1, exclude_max=True),
)
def test_waits_of_one_call_never_exceed_its_budget(
    *,
    initial: float,
    cap: float,
    jitter: str,
    strategy: str,
    recovery: float,
    minimums: list[float | None],
    work: float,
    r: float,
) -> None:
    clock = FakeClock(monotonic=50.0)
    backoff = Backoff(
        strategy=strategy,  # type: ignore[arg-type]
        initial=initial,
        max_delay=cap,
        jitter=jitter,  # type: ignore[arg-type]
        rng=lambda: r,
    )
    b = CallBudget(max_attempts=len(minimums) + 1, recovery_budget_secs=recovery, started_at=50)
    previous: float | None = None
    for n, minimum in enumerate(minimums, start=1):
        assert b.record_attempt()
        clock.advance(work)  # the attempt itself takes time, and it counts
        b.record_refusal(clock.monotonic())
        now = clock.monotonic()
        plan = plan_wait(
            backoff,
            n,
            server_minimum=minimum,
            pause_limit=3600,
            time_left=b.time_left(now),
            previous=previous,
        )
        if not plan.fits:
            break
        assert b.fits(now, plan.seconds)
        if minimum:
            assert plan.seconds >= minimum
        clock.sleep(plan.seconds)
        previous = plan.seconds
        first = b.first_refusal_at
        assert first is not None
        # the retry starts within the recovery budget measured from the first refusal
        assert clock.monotonic() - first <= recovery + 1e-6
    assert sum(clock.sleeps) <= recovery + 1e-6


def test_sdk_retries_spend_the_call_and_run_budgets() -> None:
    run = RunBudget(10)
    budget = CallBudget(max_attempts=6, recovery_budget_secs=60, started_at=0.0, run=run)
    assert budget.record_attempt()
    budget.record_sdk_retries(2)  # the SDK sent 3 requests in one attempt
    assert budget.attempts == 3 and run.used == 3
    assert budget.record_attempt()
    budget.record_sdk_retries(2)
    assert budget.attempts == 6
    assert not budget.can_attempt() and not budget.record_attempt()
    budget.record_sdk_retries(0)
    with pytest.raises(ValueError, match="SDK retries"):
        budget.record_sdk_retries(-1)


def test_a_run_charged_past_its_budget_is_exhausted() -> None:
    run = RunBudget(2)
    run.charge(5)
    assert run.exhausted and run.remaining == 0 and run.used == 5
    with pytest.raises(ValueError, match="charge"):
        run.charge(-1)
