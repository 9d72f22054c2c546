"""Provider accounting profiles: settling as the provider charges, pacing by default."""

from __future__ import annotations

from typing import Any

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.admission.profile import PROFILES, profile_for, usage_charge
from rateloop.admission.reservation import Denied, Reservation
from rateloop.errors import ConfigError
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import Dimension
from rateloop.testing import FakeClock


def reserve(limiter: Limiter, route: Route, cost: Cost) -> Reservation:
    r = limiter.try_reserve(route, cost)
    assert isinstance(r, Reservation), r
    return r


@pytest.mark.parametrize(
    ("provider", "profile"),
    [
        ("openai", "openai"),
        ("azure", "azure"),
        ("azure_openai", "azure"),
        ("anthropic", "anthropic"),
        ("gemini", "gemini"),
        ("google", "gemini"),
        ("vertex_ai", "gemini"),
        ("bedrock", "bedrock"),
        ("mistral", "generic"),
        ("OpenAI", "openai"),
    ],
)
def test_each_provider_has_its_profile(provider: str, profile: str) -> None:
    assert profile_for(provider).name == profile


def test_an_unknown_profile_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown accounting profile 'opneai'.*openai"):
        profile_for("openai", "opneai")
    with pytest.raises(ConfigError) as info:
        Policy.from_dict({"limits": {"openai:gpt-5": {"profile": "opneai"}}}, source="p.toml")
    assert info.value.key == 'limits."openai:gpt-5".profile'
    assert "'anthropic'" in str(info.value)


def _output_after_settle(provider: str, profile: str | None = None) -> float:
    """Output tokens still counted after a call that reserved 800 and produced 100."""
    clock = FakeClock()
    scope = f"{provider}:m"
    spec = LimitSpec(output_tokens_per_minute=6_000, burst=1.0, profile=profile)
    limiter = Limiter(limits={scope: spec}, clock=clock)
    route = Route(provider=provider, model="m")
    reserve(limiter, route, Cost(output_tokens=800)).settle(0, 100)
    # What is left of the 6000 burst is 6000 - in use: probe it exactly.
    left = 0
    for step in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        r = limiter.try_reserve(route, Cost(output_tokens=left + step))
        if isinstance(r, Reservation):
            r.release()
            left += step
    return 6_000 - left


@pytest.mark.parametrize(
    ("provider", "in_use"),
    [
        ("openai", 800),  # max_tokens counted at admission and kept
        ("anthropic", 100),  # estimated from max_tokens, corrected at the end
        ("azure", 100),
        ("bedrock", 100),
        ("gemini", 100),
        ("mistral", 100),  # generic: corrected
    ],
)
def test_settlement_follows_the_providers_profile(provider: str, in_use: int) -> None:
    assert _output_after_settle(provider) == in_use


def test_a_policy_key_overrides_the_profile_per_scope() -> None:
    # An OpenAI-compatible gateway that corrects usage like Anthropic does.
    assert _output_after_settle("openai", profile="anthropic") == 100
    assert _output_after_settle("mistral", profile="openai") == 800


def test_a_release_refunds_tokens_but_keeps_the_request_for_every_profile() -> None:
    for name in PROFILES:
        clock = FakeClock()
        limiter = Limiter(
            limits={
                "x:m": LimitSpec(
                    requests_per_minute=1, output_tokens_per_minute=1_000, profile=name
                )
            },
            clock=clock,
        )
        route = Route(provider="x", model="m")
        reserve(limiter, route, Cost(output_tokens=900)).release()
        d = limiter.try_reserve(route, Cost(output_tokens=900))
        assert isinstance(d, Denied) and d.dimension is Dimension.REQUESTS, name


def test_gemini_tokens_per_minute_counts_input_only() -> None:
    clock = FakeClock()
    limiter = Limiter(
        limits={"gemini:flash": LimitSpec(tokens_per_minute=6_000, burst=1.0)}, clock=clock
    )
    route = Route(provider="gemini", model="flash")
    # 5000 input + 5000 max output: 10000 tokens, but Gemini's TPM counts the 5000 input.
    r = reserve(limiter, route, Cost(input_tokens=5_000, output_tokens=5_000))
    r.settle(4_000, 3_000)  # input corrected to 4000; output never counted
    assert isinstance(limiter.try_reserve(route, Cost(input_tokens=2_000)), Reservation)
    assert isinstance(limiter.try_reserve(route, Cost(input_tokens=1)), Denied)


@pytest.mark.parametrize(
    ("profile", "usage", "charged"),
    [
        # Anthropic: input_tokens excludes cache reads (not counted) and writes (counted).
        (
            "anthropic",
            {
                "input_tokens": 9,
                "cache_creation_input_tokens": 100,
                "cache_read_input_tokens": 17_000,
                "output_tokens": 8,
            },
            (109, 8),
        ),
        # OpenAI: prompt_tokens includes cached tokens, and they count.
        (
            "openai",
            {
                "prompt_tokens": 1_000,
                "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 900},
            },
            (1_000, 20),
        ),
        # Gemini REST usageMetadata.
        ("gemini", {"promptTokenCount": 50, "candidatesTokenCount": 7}, (50, 7)),
        # Bedrock Converse usage: cache reads released at settlement, writes counted.
        (
            "bedrock",
            {
                "inputTokens": 30,
                "outputTokens": 4,
                "cacheReadInputTokens": 500,
                "cacheWriteInputTokens": 70,
            },
            (100, 4),
        ),
        ("generic", {"input_tokens": 3, "output_tokens": 4}, (3, 4)),
    ],
)
def test_usage_is_read_as_the_provider_charges_it(
    profile: str, usage: dict[str, Any], charged: tuple[int, int]
) -> None:
    assert usage_charge(PROFILES[profile], usage) == charged

    class Obj:  # an SDK object: the same fields as attributes
        pass

    obj = Obj()
    for key, value in usage.items():
        setattr(obj, key, value)
    if "prompt_tokens_details" not in usage:
        assert usage_charge(PROFILES[profile], obj) == charged


def test_settle_usage_takes_the_sdk_usage_object() -> None:
    clock = FakeClock()
    limiter = Limiter(
        limits={"anthropic:c": LimitSpec(input_tokens_per_minute=6_000, burst=1.0)}, clock=clock
    )
    route = Route(provider="anthropic", model="c")
    r = reserve(limiter, route, Cost(input_tokens=5_000))
    # 5000 estimated; the provider counted 9 + 100 (the cache read of 4900 is free).
    r.settle_usage(
        {"input_tokens": 9, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 4_900}
    )
    assert isinstance(limiter.try_reserve(route, Cost(input_tokens=5_891)), Reservation)


# -- pacing by default ----------------------------------------------------------------


def test_a_configured_minute_is_spread_over_it_not_spent_at_once() -> None:
    clock = FakeClock()
    limiter = Limiter(limits={"openai:gpt-5": LimitSpec(requests_per_minute=1_200)}, clock=clock)
    route = Route(provider="openai", model="gpt-5")
    granted = 0
    while isinstance(limiter.try_reserve(route, Cost()), Reservation):
        granted += 1
    assert granted == 20  # one second of 1200 RPM, not 1200 at once
    d = limiter.try_reserve(route, Cost())
    assert isinstance(d, Denied) and d.retry_after == pytest.approx(0.05)
    # Over a minute the full rate is still admitted: 20 at once, then 20 a second.
    for _ in range(60 * 100):
        clock.advance(0.01)
        while isinstance(limiter.try_reserve(route, Cost()), Reservation):
            granted += 1
    assert granted == pytest.approx(20 + 1_200, abs=1)


def test_burst_stays_configurable() -> None:
    clock = FakeClock()
    limiter = Limiter(
        limits={"openai:gpt-5": LimitSpec(requests_per_minute=1_200, burst=0.5)}, clock=clock
    )
    route = Route(provider="openai", model="gpt-5")
    granted = 0
    while isinstance(limiter.try_reserve(route, Cost()), Reservation):
        granted += 1
    assert granted == 600


def test_paced_tokens_still_admit_a_call_larger_than_one_second() -> None:
    """8000 OTPM is 133 a second: a 1024 max_tokens call waits for an idle bucket, then goes."""
    clock = FakeClock()
    limiter = Limiter(
        limits={"anthropic:c": LimitSpec(output_tokens_per_minute=8_000)}, clock=clock
    )
    route = Route(provider="anthropic", model="c")
    r = reserve(limiter, route, Cost(output_tokens=1_024))
    r.settle(0, 1_024)
    d = limiter.try_reserve(route, Cost(output_tokens=1_024))
    assert isinstance(d, Denied) and not d.never_fits
    assert d.retry_after == pytest.approx(1_024 / (8_000 / 60))
    too_big = limiter.try_reserve(route, Cost(output_tokens=8_001))
    assert isinstance(too_big, Denied) and too_big.never_fits
