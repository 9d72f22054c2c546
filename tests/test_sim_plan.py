"""Capacity planning against values computed by hand."""

from __future__ import annotations

import pytest

from rateloop.sim import Workload, plan_capacity
from rateloop.testing import FakeLimits

# 40 tasks × 5 calls of exactly 600 input / 400 max output tokens (200 produced).
WORK = Workload.generate(tasks=40, calls=5, spread=0, input_tokens=600, max_tokens=400,
                         output_ratio=0.5)


def test_openai_tokens_bind_and_the_target_needs_both_limits_raised() -> None:
    plan = plan_capacity(WORK, FakeLimits(rpm=60, tpm=40_000, burst_seconds=5), latency=2.0,
                         target_secs=120)
    # tokens: 200 × 1000 = 200,000; rate 666.67/s, burst 3,333.3 -> (200,000 - 3,333.3) / 666.67
    assert plan.completion_secs == pytest.approx(295.0)
    assert plan.binding == "tokens per minute (tpm)"
    rpm, tpm = plan.dimensions
    assert (rpm.demand, rpm.seconds) == (200.0, pytest.approx(195.0))  # (200 - 5) / 1
    assert tpm.per_call == 1000.0
    # λ = min(1 request/s, 666.67 / 1000 calls/s) = 0.6667/s = 40/min; × 2 s = 1.33 -> 2
    assert plan.calls_per_minute == pytest.approx(40.0)
    assert plan.useful_concurrency == 2
    # L >= 60 × D / (T + burst): 60 × 200,000 / 125 = 96,000 and 60 × 200 / 125 = 96
    assert (rpm.needed_for_target, tpm.needed_for_target) == (96, 96_000)
    assert plan.target_feasible is True
    assert "rpm 60 -> 96 (×1.60), tpm 40,000 -> 96,000 (×2.40)" in plan.lines()[-1]


def test_anthropic_counts_input_without_output_and_corrects_output() -> None:
    plan = plan_capacity(WORK, FakeLimits(itpm=20_000, otpm=8_000, burst_seconds=5),
                         profile="anthropic", latency=2.0)
    itpm, otpm = plan.dimensions
    # input: 120,000 at 333.33/s beyond a 1,666.7 burst = 355 s
    assert itpm.seconds == pytest.approx(355.0)
    # output corrected to the 200 produced: 40,000 at 133.33/s beyond 666.7 = 295 s
    assert (otpm.per_call, otpm.seconds) == (200.0, pytest.approx(295.0))
    assert plan.binding == "input tokens per minute (itpm)"
    # λ = min(333.33 / 600, 133.33 / 200) = 0.5556/s = 33.3/min; × 2 s = 1.11 -> 2
    assert plan.calls_per_minute == pytest.approx(33.333, rel=1e-3)
    assert plan.useful_concurrency == 2


def test_concurrency_limit_by_littles_law() -> None:
    plan = plan_capacity(WORK, FakeLimits(concurrency=4), latency=3.0)
    assert plan.completion_secs == pytest.approx(150.0)  # 200 × 3 s / 4
    assert plan.binding == "concurrency (4)"
    assert plan.calls_per_minute == pytest.approx(80.0)  # 4 / 3 s
    assert plan.useful_concurrency == 4


def test_unreachable_target_and_day_shortfall() -> None:
    plan = plan_capacity(WORK, FakeLimits(rpm=6000, rpd=150), latency=2.0, target_secs=5)
    assert plan.critical_path_secs == 10.0  # 5 calls × 2 s
    assert plan.completion_secs == 10.0
    assert plan.binding == "the longest task's chain of calls"
    assert plan.target_feasible is False
    assert plan.day_shortfall == 50
    text = "\n".join(plan.lines())
    assert "cannot be met by raising limits" in text
    assert "The day quota is 50 calls short" in text


def test_limits_that_already_meet_the_target() -> None:
    plan = plan_capacity(WORK, FakeLimits(rpm=10_000, tpm=10_000_000), latency=2.0,
                         target_secs=60)
    assert plan.lines()[-1] == "The current limits already meet 60 s."


@pytest.mark.parametrize(
    ("options", "message"),
    [({"latency": 0}, "latency must be > 0 seconds, got 0"),
     ({"target_secs": -1}, "target must be > 0 seconds, got -1")],
)
def test_bad_plan_inputs(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_capacity(WORK, FakeLimits(rpm=60), **options)
