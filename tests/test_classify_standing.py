"""Refusals that stand (issue 27, items 3, 4 and 7): a limit of zero, credits and key caps,
and requests that must change are never read as throttles, whatever status a relay gives them.

The messages are the real ones recorded in ``tests/fixtures/classify`` (each names its
source there); here they are sent with the statuses relays give them (a gateway's 500, a
proxy's 503, a 429), and through the loop, to check the Exit each kind leads to.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rateloop.classify import classify, classify_exception
from rateloop.classify._standing import credit_exhausted, must_change, zero_quota
from rateloop.cli import app
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import Kind
from rateloop.testing import FakeClock, FaultScript

NOW = datetime(2026, 1, 1, tzinfo=UTC)

# continuedev/continue#9729 (Gemini free tier, a model with no free quota).
GEMINI_ZERO = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. "
    "To monitor your current usage, head to: https://ai.dev/rate-limit. \n* Quota exceeded "
    "for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, "
    "limit: 0, model: gemini-3-pro\nPlease retry in 3.98361248s."
)
# terricain/aioboto3#352 (Bedrock ValidationException).
ON_DEMAND = (
    "Invocation of model ID anthropic.claude-3-5-sonnet-20241022-v2:0 with on-demand "
    "throughput isn’t supported. Retry your request with the ID or ARN of an inference "
    "profile that contains this model."
)
# vercel/ai#2772 (Bedrock ValidationException).
MAX_TOKENS = (
    "The maximum tokens you requested exceeds the model limit of 4096. Try again with a "
    "maximum tokens value that is lower than 4096."
)
# openai/openai-agents-python#806 (Azure OpenAI content filter).
CONTENT_FILTER = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content "
    "management policy. Please modify your prompt and retry. To learn more about our "
    "content filtering policies please read our documentation: "
    "https://go.microsoft.com/fwlink/?linkid=2198766"
)
# gptme/gptme#1449 and anomalyco/opencode#12219 (OpenRouter).
KEY_LIMIT = "Key limit exceeded (monthly limit). Manage it using https://openrouter.ai/settings/keys"
AFFORD = (
    "This request requires more credits, or fewer max_tokens. You requested up to 32000 "
    "tokens, but can only afford 0. To increase, visit https://openrouter.ai/settings/keys "
    "and create a key with a higher monthly limit"
)


def _openai_shaped(message: str, code: Any = None) -> str:
    return json.dumps({"error": {"message": message, "type": "", "param": "", "code": code}})


def _google(message: str, status: int = 429) -> str:
    return json.dumps(
        {"error": {"code": status, "message": message, "status": "RESOURCE_EXHAUSTED"}}
    )


# --- the phrases -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GEMINI_ZERO, "limit: 0"),
        ("Quota exceeded for metric: ...\nlimit: 0. Please retry in 59s.", "limit: 0"),
        ("Quota exceeded, limit: 0", "limit: 0"),
        ('metadata { key: "quota_limit_value" value: "0" } quota', "quota_limit_value 0"),
        ("{'quotaId': 'X', 'quotaValue': '0'}", "quotaValue 0"),
        # gemini-cli's own cases: a fractional limit is a limit (googleQuotaErrors.test.ts)
        ("Quota exceeded for metric: ...\nlimit: 0.5. Please retry in 59s.", None),
        ("Quota exceeded for metric: x, limit: 10000", None),
        ("Quota exceeded for metric: x, limit: 05", None),
        ('quotaValue: "0.5"', None),
        # "limit: 0" alone, without a quota, is too common a string to mean anything
        ("retry budget limit: 0 (disabled)", None),
    ],
)
def test_zero_quota_reads_a_limit_of_zero_only(text: str, expected: str | None) -> None:
    assert zero_quota(text) == expected


def test_the_phrases_name_their_evidence() -> None:
    assert credit_exhausted(KEY_LIMIT) == "key limit exceeded"
    assert credit_exhausted(AFFORD) == "requires more credits"
    assert credit_exhausted("Rate limit exceeded: free-models-per-day") is None
    assert must_change(ON_DEMAND) == "on-demand throughput isn't supported"
    assert must_change(ON_DEMAND.replace("’", "'")) == "on-demand throughput isn't supported"
    assert must_change(MAX_TOKENS) == "max tokens over the limit"
    assert must_change(CONTENT_FILTER) == "content filter"
    assert must_change("Too many tokens, please wait before trying again.") is None


# --- whatever the status a relay gives them ------------------------------------------------


@pytest.mark.parametrize("status", [429, 499, 500, 503])
def test_a_limit_of_zero_is_permission_whatever_the_status(status: int) -> None:
    for body in (_google(GEMINI_ZERO, status), _openai_shaped(GEMINI_ZERO)):
        signal = classify(status, {}, body, now=NOW)
        assert (signal.kind, signal.retryable) == (Kind.PERMISSION, False), (status, body)
        assert signal.matched == "limit: 0"


@pytest.mark.parametrize("status", [400, 429, 500, 503])
@pytest.mark.parametrize("message", [ON_DEMAND, MAX_TOKENS, CONTENT_FILTER])
def test_a_request_that_must_change_is_invalid_whatever_the_status(
    status: int, message: str
) -> None:
    signal = classify(status, {}, _openai_shaped(message), now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.INVALID, False)


@pytest.mark.parametrize("status", [429, 500])
def test_a_content_filter_code_is_invalid_even_on_a_429(status: int) -> None:
    body = json.dumps({"error": {"message": "filtered", "code": "content_filter"}})
    signal = classify(status, {}, body, provider="azure", now=NOW)
    assert signal.kind is Kind.INVALID


def test_a_throttle_named_by_bedrock_is_still_a_throttle() -> None:
    headers = {"x-amzn-errortype": "ThrottlingException"}
    body = json.dumps({"message": "Too many tokens, please wait before trying again."})
    assert classify(429, headers, body, now=NOW).kind is Kind.TEMPORARY


@pytest.mark.parametrize("status", [401, 403, 429, 500, 502])
@pytest.mark.parametrize("message", [KEY_LIMIT, AFFORD])
def test_credits_and_key_caps_are_spend_whatever_the_status(status: int, message: str) -> None:
    signal = classify(status, {}, _openai_shaped(message, code=status), now=NOW)
    assert (signal.kind, signal.retryable) == (Kind.SPEND, False)


@pytest.mark.parametrize("source", ["openrouter_credits", "openrouter_key_limit"])
def test_openrouter_limit_source_is_spend(source: str) -> None:
    error = {"message": "Payment Required", "code": 402, "metadata": {"limit_source": source}}
    body = json.dumps({"error": error})
    signal = classify(500, {}, body, now=NOW)
    assert signal.kind is Kind.SPEND and signal.matched == source


# --- the Exit each one leads to ------------------------------------------------------------

A = Route(provider="google", model="gemini-3-pro")
B = Route(provider="google", model="gemini-2.5-flash")
GOOGLE = "https://generativelanguage.googleapis.com/v1beta/models/gemini-3-pro:generateContent"

Runner = Callable[..., Outcome]


def _error(status: int, body: str, url: str = GOOGLE) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", url)
    response = httpx.Response(status, content=body.encode(), request=request)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=response)


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest, clock: FakeClock) -> Runner:
    def runner(fn: Any, **kw: Any) -> Outcome:
        policy = Policy.from_dict({"backoff": {"jitter": "none"}})
        if request.param == "sync":
            return RateLoop(policy, clock=clock, rng=lambda: 0.5).call(fn, **kw)
        return asyncio.run(AsyncRateLoop(policy, clock=clock, rng=lambda: 0.5).call(fn, **kw))

    return runner


def test_a_limit_of_zero_needs_an_operator_after_one_call(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([_error(429, _google(GEMINI_ZERO))])
    out = run(fn, route=A)
    assert out.status is Status.NEEDS_OPERATOR
    assert out.signal is not None and out.signal.kind is Kind.PERMISSION
    assert len(fn.calls) == 1 and clock.sleeps == []


def test_a_limit_of_zero_does_not_fall_back_within_the_same_refusal(
    run: Runner, clock: FakeClock
) -> None:
    # permission is surfaced as it is: another model of the same project may have quota,
    # but that is the operator's choice, not a retry's.
    fn = FaultScript([_error(429, _google(GEMINI_ZERO))])
    out = run(fn, route=A, fallbacks=[B])
    assert out.status is Status.NEEDS_OPERATOR
    assert fn.models == ["gemini-3-pro"] and clock.sleeps == []


def test_on_demand_throughput_relayed_as_a_500_is_invalid_after_one_call(
    run: Runner, clock: FakeClock
) -> None:
    fn = FaultScript([_error(500, _openai_shaped(ON_DEMAND), url="http://127.0.0.1:3000/v1")])
    out = run(fn, route=Route(provider="openai", model="claude"))
    assert out.status is Status.INVALID
    assert len(fn.calls) == 1 and clock.sleeps == []


def test_a_key_cap_on_a_403_needs_an_operator_as_spend(run: Runner, clock: FakeClock) -> None:
    url = "https://openrouter.ai/api/v1/chat/completions"
    fn = FaultScript([_error(403, _openai_shaped(KEY_LIMIT, code=403), url=url)])
    out = run(fn, route=Route(provider="openrouter", model="z-ai/glm-5"))
    assert out.status is Status.NEEDS_OPERATOR
    assert out.signal is not None and out.signal.kind is Kind.SPEND
    assert len(fn.calls) == 1 and clock.sleeps == []


# --- what `rateloop classify` says --------------------------------------------------------


def test_rateloop_classify_says_a_zero_limit_needs_an_operator_not_a_retry() -> None:
    saved = "HTTP/1.1 429 Too Many Requests\ncontent-type: application/json\n\n" + _google(
        GEMINI_ZERO
    )
    result = CliRunner().invoke(app, ["classify", "-"], input=saved)
    assert result.exit_code == 0, result.output
    first, rest = result.stdout.split("\n", 1)
    assert first.startswith("permission: ") and "no quota at all for this model" in first
    assert "retry" not in first.replace("retrying will not help", "")
    assert json.loads(rest)["matched"] == "limit: 0"


@pytest.mark.parametrize("status", [500, 502, 503])
def test_an_upstream_402_object_relayed_in_a_5xx_is_spend(status: int) -> None:
    # What a gateway does with OpenRouter's credit refusal (ScreamingFace/screamingface#679,
    # tailcallhq/forgecode#571): the upstream error object, with the gateway's own status.
    body = json.dumps({"error": {"message": "Payment Required", "code": 402}})
    signal = classify(status, {}, body, now=NOW)
    assert (signal.kind, signal.matched) == (Kind.SPEND, f"error 402 in a {status}")
    # only the 402 means credit: another upstream code in a 5xx stays a server error
    other = json.dumps({"error": {"message": "Bad Gateway", "code": 404}})
    assert classify(status, {}, other, now=NOW).kind is Kind.SERVER_ERROR


def test_the_genai_sdks_exception_for_a_zero_limit_is_permission() -> None:
    errors = pytest.importorskip("google.genai.errors")
    exc = errors.ClientError(429, json.loads(_google(GEMINI_ZERO)), None)
    signal = classify_exception(exc, now=NOW)
    assert (signal.kind, signal.provider, signal.matched) == (
        Kind.PERMISSION, "google", "limit: 0"
    )
