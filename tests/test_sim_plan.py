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
    # = 295 s until the last call is admitted, and its answer takes 2 s more
    assert plan.completion_secs == pytest.approx(297.0)
    assert plan.binding == "tokens per minute (tpm)"
    rpm, tpm = plan.dimensions
    assert (rpm.demand, rpm.seconds) == (200.0, pytest.approx(197.0))  # (200 - 5) / 1 + 2
    assert tpm.per_call == 1000.0
    # λ = min(1 request/s, 666.67 / 1000 calls/s) = 0.6667/s = 40/min; × 2 s = 1.33 -> 2
    assert plan.calls_per_minute == pytest.approx(40.0)
    assert plan.useful_concurrency == 2
    # L >= 60 × D / (T - latency + burst): 60 × 200,000 / 123 = 97,560.98 and 60 × 200 / 123
    assert (rpm.needed_for_target, tpm.needed_for_target) == (98, 97_561)
    assert plan.target_feasible is True
    assert "rpm 60 -> 98 (×1.63), tpm 40,000 -> 97,561 (×2.44)" in plan.lines()[-1]


def test_calls_larger_than_the_bucket_are_let_in_from_a_full_one() -> None:
    # 20 calls of 5,000 tokens against 20,000 TPM: the bucket holds 1,666.7 (5 s), so a
    # call waits for 1,666.7 tokens, not 5,000, and the last call's excess needs no refill:
    # (100,000 - (5,000 - 1,666.7) - 1,666.7) / 333.33 = 285 s, answered 2 s later.
    big = Workload.generate(tasks=10, calls=2, spread=0, input_tokens=3000, max_tokens=2000)
    plan = plan_capacity(big, FakeLimits(tpm=20_000, burst_seconds=5), latency=2.0,
                         target_secs=100)
    assert plan.completion_secs == pytest.approx(287.0)
    # Within 100 s: (100,000 - 5,000) / r + 2 <= 100 with the call beyond the bucket
    # -> r >= 969.4/s -> 58,164 TPM (its 5 s bucket, 4,847, is still below 5,000).
    (tpm,) = plan.dimensions
    assert tpm.needed_for_target == 58_164
    assert plan.raises[0].needed == 58_164


def test_a_call_larger_than_the_minutes_limit_never_finishes() -> None:
    # 5,000 tokens a call against 4,000 TPM: the provider refuses it whatever the wait.
    big = Workload.generate(tasks=10, calls=1, spread=0, input_tokens=3000, max_tokens=2000)
    plan = plan_capacity(big, FakeLimits(tpm=4_000), latency=2.0, target_secs=1000)
    assert plan.completion_secs == float("inf")
    lines = plan.lines()
    assert lines[0] == "10 calls cannot all finish (bound by tokens per minute (tpm))."
    assert "a call needs 5,000, more than the whole minute's limit" in lines[2]
    # The limit a target needs admits the largest call first of all.
    (tpm,) = plan.dimensions
    assert tpm.needed_for_target is not None and tpm.needed_for_target >= 5_000


def test_the_ideal_is_a_lower_bound_on_every_strategys_wall() -> None:
    # The simulator's "quota-bound ideal" is the plan's completion time; no strategy can
    # finish faster, calls larger than the bucket included.
    from rateloop.sim import build_scenario, run_strategy

    big = Workload.generate(tasks=10, calls=2, input_tokens=3000, max_tokens=2000, seed=3)
    scenario = build_scenario("burst", rpm=None, tpm=20_000, workload=big)
    for strategy in ("rateloop", "rateloop-zero"):
        result = run_strategy(scenario, strategy)
        assert result.completed == 10
        assert result.wall >= result.ideal > 0


def test_anthropic_counts_input_without_output_and_corrects_output() -> None:
    plan = plan_capacity(WORK, FakeLimits(itpm=20_000, otpm=8_000, burst_seconds=5),
                         profile="anthropic", latency=2.0)
    itpm, otpm = plan.dimensions
    # input: 120,000 at 333.33/s beyond a 1,666.7 burst = 355 s, + 2 s of answer
    assert itpm.seconds == pytest.approx(357.0)
    # output corrected to the 200 produced: 40,000 at 133.33/s beyond 666.7 = 295 s + 2 s
    assert (otpm.per_call, otpm.seconds) == (200.0, pytest.approx(297.0))
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


def test_a_target_bound_by_concurrency_asks_for_more_concurrency() -> None:
    # 20 rounds of 3 s fit in 60 s: 200 calls need ceil(200 / 20) = 10 at once.
    plan = plan_capacity(WORK, FakeLimits(concurrency=4), latency=3.0, target_secs=60)
    assert plan.target_feasible is True
    assert [(r.name, r.limit, r.needed) for r in plan.raises] == [("concurrency", 4, 10)]
    assert plan.lines()[-1] == "To finish in 60 s: concurrency 4 -> 10 (×2.50)."


def test_a_target_with_a_day_quota_short_asks_for_the_day_quota() -> None:
    plan = plan_capacity(WORK, FakeLimits(rpm=6000, rpd=150), latency=2.0, target_secs=60)
    assert plan.day_shortfall == 50
    assert plan.lines()[-1] == "To finish in 60 s: rpd 150 -> 200 (×1.33)."


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
