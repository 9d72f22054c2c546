"""The sans-IO rules of an agent step: waits, bounds, fallback, and how each attempt ends."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rateloop.agents.command import Agent
from rateloop.agents.settings import AgentSettings, SettingsLayer, resolve_settings
from rateloop.agents.step import (
    EXIT_TEMPFAIL,
    EXIT_TIMEOUT,
    EXIT_UNUSABLE_RESULT,
    RESET_MARGIN_SECS,
    AttemptReport,
    Finish,
    Retry,
    StepFailure,
    StepLoop,
    WaitForReset,
)
from rateloop.outcome import Status
from rateloop.signal import Kind, LimitSignal

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LIMITED = LimitSignal.of(Kind.TEMPORARY, matched="hit your rate limit")


def _loop(agent: Agent = Agent.CLAUDE, model: str | None = None, **flags: object) -> StepLoop:
    settings = resolve_settings(flags=SettingsLayer(**flags))  # type: ignore[arg-type]
    return StepLoop(settings=settings, agent=agent, label="claude", model=model)


def _run_limited(loop: StepLoop) -> list[Retry | Finish]:
    """Every attempt is rate limited: the decisions until the loop finishes."""
    decisions: list[Retry | Finish] = []
    number = 1
    while True:
        plan = loop.plan(number)
        decision = loop.decide(plan, AttemptReport(exit_code=1), LIMITED, now=NOW)
        decisions.append(decision)
        if isinstance(decision, Finish):
            return decisions
        number += 1


def test_default_schedule_is_60_120_240_480_600() -> None:
    decisions = _run_limited(_loop())
    waits = [d.wait for d in decisions if isinstance(d, Retry)]
    assert waits == [60, 120, 240, 480, 600]
    final = decisions[-1]
    assert isinstance(final, Finish)
    assert final.status is Status.FAILED_RETRY_EXHAUSTED
    assert final.exit_code == EXIT_TEMPFAIL
    assert isinstance(final.value, StepFailure)
    assert final.value.message.startswith(
        "Error: claude rate limit persisted after 5 retries (6 attempts total)."
    )


@pytest.mark.parametrize("retries", [0, 1, 3, 100])
def test_executions_are_bounded_to_one_plus_max_retries(retries: int) -> None:
    assert len(_run_limited(_loop(max_retries=retries, base_delay_secs=0.0))) == retries + 1


def test_base_zero_means_no_waits() -> None:
    waits = [d.wait for d in _run_limited(_loop(base_delay_secs=0.0)) if isinstance(d, Retry)]
    assert waits == [0, 0, 0, 0, 0]


@given(
    base=st.floats(min_value=0, max_value=1e6) | st.sampled_from([2.2e-311, 5e-324, 1e-4]),
    cap=st.floats(min_value=0, max_value=1e7),
    n=st.integers(min_value=1, max_value=10**6),
)
def test_wait_is_min_of_doubling_and_cap_and_saturates(base: float, cap: float, n: int) -> None:
    loop = _loop(base_delay_secs=base, max_delay_secs=cap)
    # Settings keep delays within a day, to the millisecond.
    base, cap = (round(min(x, 86_400.0), 3) for x in (base, cap))
    effective_cap = max(cap, base)
    wait = loop.wait_before(n)
    try:
        doubled = math.ldexp(base, n - 1)
    except OverflowError:
        doubled = math.inf
    assert wait == pytest.approx(min(doubled, effective_cap))
    assert math.isfinite(wait)
    if base == 0:
        assert wait == 0


def test_exit_zero_is_success_even_with_a_rate_limit_signal() -> None:
    loop = _loop()
    d = loop.decide(loop.plan(1), AttemptReport(exit_code=0, result="ok"), LIMITED, now=NOW)
    assert d == Finish(status=Status.COMPLETED, reason="completed", exit_code=0, value="ok")


@pytest.mark.parametrize(
    ("kind", "status"),
    [(Kind.PERMISSION, Status.NEEDS_OPERATOR), (Kind.INVALID, Status.INVALID)],
)
def test_other_failures_fail_fast_with_the_childs_code(kind: Kind, status: Status) -> None:
    loop = _loop()
    d = loop.decide(loop.plan(1), AttemptReport(exit_code=2), LimitSignal.of(kind), now=NOW)
    assert isinstance(d, Finish)
    assert (d.status, d.exit_code) == (status, 2)
    assert isinstance(d.value, StepFailure)
    assert d.value.message == "Error: claude failed (exit 2)"
    assert d.value.child_exit_code == 2


def test_a_child_killed_by_a_signal_exits_like_a_shell() -> None:
    loop = _loop()
    d = loop.decide(loop.plan(1), AttemptReport(exit_code=-9), None, now=NOW)
    assert isinstance(d, Finish)
    assert d.exit_code == 137
    assert isinstance(d.value, StepFailure)
    assert d.value.message == "Error: claude failed (exit 137), killed by signal 9"


def test_timeout_is_not_retried() -> None:
    loop = _loop()
    report = AttemptReport(exit_code=-15, timed_out=True, timeout=2.0)
    d = loop.decide(loop.plan(1), report, LIMITED, now=NOW)
    assert isinstance(d, Finish)
    assert (d.status, d.exit_code) == (Status.NEEDS_OPERATOR, EXIT_TIMEOUT)
    assert isinstance(d.value, StepFailure)
    assert d.value.timed_out
    assert d.value.child_exit_code is None
    assert "timed out after 2s on attempt 1 of 6" in d.value.message


def test_period_quota_is_not_retried_and_names_the_reset() -> None:
    reset = NOW + timedelta(hours=3)
    signal = LimitSignal.of(Kind.PERIOD_QUOTA, matched="usage limit reached", reset_at=reset)
    loop = _loop()
    d = loop.decide(loop.plan(1), AttemptReport(exit_code=1), signal, now=NOW)
    assert isinstance(d, Finish)
    assert (d.status, d.exit_code, d.retry_at) == (Status.WAITING_FOR_RESET, EXIT_TEMPFAIL, reset)
    assert isinstance(d.value, StepFailure)
    assert "2026-01-01T03:00:00+00:00" in d.value.message


def test_unusable_result_is_invalid() -> None:
    loop = _loop()
    report = AttemptReport(exit_code=0, result_error="codex's final message is empty")
    d = loop.decide(loop.plan(1), report, None, now=NOW)
    assert isinstance(d, Finish)
    assert (d.status, d.exit_code) == (Status.INVALID, EXIT_UNUSABLE_RESULT)


def test_fallback_only_on_the_final_retry_for_claude_and_copilot() -> None:
    for agent in (Agent.CLAUDE, Agent.COPILOT):
        loop = _loop(agent, model="opus", max_retries=2, fallback_auto_model=True)
        assert [loop.plan(n).model for n in (1, 2, 3)] == ["opus", "opus", "auto"]
        assert loop.plan(3).fallback
    for agent in (Agent.CODEX, Agent.GEMINI, Agent.GENERIC):
        loop = _loop(agent, model="o3", max_retries=2, fallback_auto_model=True)
        assert [loop.plan(n).model for n in (1, 2, 3)] == ["o3", "o3", "o3"]
    off = _loop(Agent.CLAUDE, model="opus", max_retries=2)
    assert off.plan(3).model == "opus"
    single = _loop(Agent.CLAUDE, model="opus", max_retries=0, fallback_auto_model=True)
    assert single.plan(1).model == "opus"  # a single run is not a retry: no fallback


def test_success_on_the_fallback_is_degraded() -> None:
    loop = _loop(Agent.COPILOT, max_retries=1, fallback_auto_model=True)
    plan = loop.plan(2)
    d = loop.decide(plan, AttemptReport(exit_code=0, result="done"), None, now=NOW)
    assert isinstance(d, Finish)
    assert (d.status, d.exit_code, d.value) == (Status.DEGRADED, 0, "done")
    assert d.note is not None and "--model auto" in d.note


def test_overload_is_retried_like_a_rate_limit() -> None:
    loop = _loop()
    overload = LimitSignal.of(Kind.OVERLOAD, matched="overloaded_error")
    d = loop.decide(loop.plan(1), AttemptReport(exit_code=1), overload, now=NOW)
    assert d == Retry(wait=60.0, retry=1, signal=overload)


def test_repr() -> None:
    loop = StepLoop(settings=AgentSettings(), agent=Agent.CODEX, label="codex", model="o3")
    assert repr(loop).startswith("StepLoop(agent=codex, label='codex', model='o3', AgentSettings(")


def _quota(reset_at: datetime | None) -> LimitSignal:
    return LimitSignal.of(Kind.PERIOD_QUOTA, reset_at=reset_at, matched="hit your limit")


@pytest.mark.parametrize(
    ("left", "waits"), [(0.0, True), (3600.0, True), (3600.001, False), (-30.0, True)]
)
def test_wait_for_reset_bound_is_inclusive(left: float, waits: bool) -> None:
    settings = resolve_settings()
    loop = StepLoop(settings=settings, agent=Agent.CLAUDE, label="claude", wait_for_reset=3600)
    reset = NOW + timedelta(seconds=left)
    decision = loop.decide(loop.plan(1), AttemptReport(exit_code=1), _quota(reset), now=NOW)
    assert isinstance(decision, WaitForReset) is waits
    if isinstance(decision, WaitForReset):
        assert decision.until == max(reset, NOW) + timedelta(seconds=RESET_MARGIN_SECS)
        assert decision.wait == max(0.0, left) + RESET_MARGIN_SECS
        assert loop.plan(2).total == 7  # the run after the reset is an extra execution


def test_after_the_reset_the_retry_schedule_starts_where_it_was() -> None:
    loop = StepLoop(
        settings=resolve_settings(), agent=Agent.CLAUDE, label="claude", wait_for_reset=3600
    )
    first = loop.decide(
        loop.plan(1), AttemptReport(exit_code=1), _quota(NOW + timedelta(minutes=5)), now=NOW
    )
    assert isinstance(first, WaitForReset)
    decisions = []
    number = 2
    while True:
        decision = loop.decide(loop.plan(number), AttemptReport(exit_code=1), LIMITED, now=NOW)
        decisions.append(decision)
        if isinstance(decision, Finish):
            break
        number += 1
    retries = [(d.retry, d.wait) for d in decisions if isinstance(d, Retry)]
    assert retries == [(1, 60), (2, 120), (3, 240), (4, 480), (5, 600)]
    final = decisions[-1]
    assert isinstance(final, Finish) and isinstance(final.value, StepFailure)
    assert "persisted after 5 retries (7 attempts total)" in final.value.message
    assert repr(loop).endswith("wait_for_reset=3600)")
