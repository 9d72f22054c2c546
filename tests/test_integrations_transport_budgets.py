"""The transport's two recovery bounds and its off switch, through the real OpenAI SDK.

Issue 14: the 429 budget (``max_attempts`` 20, counting the first) is separate
from the bound on network errors and other 5xx (``max_error_attempts``, 5 in
the transport when the policy leaves it unset); ``max_attempts = 1`` turns off
429 retries alone; the policy's ``enabled = false`` sends each request exactly
once.  Real HTTP on 127.0.0.1, attempts counted at the server, waits on a FakeClock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import rateloop
from rateloop import Policy, Status
from rateloop.integrations import httpx2 as rl_httpx2
from rateloop.integrations._transport import OUTCOME_KEY, TRANSPORT_ERROR_ATTEMPTS
from rateloop.testing import FakeClock
from transport_server import ScriptedProvider, Step

MESSAGES = [{"role": "user", "content": "say hello"}]
RATE_LIMITED = {"error": {"type": "rate_limit_error", "message": "Rate limit reached"}}
UNAVAILABLE = {"error": {"message": "unavailable"}}


@pytest.fixture
def server() -> Iterator[ScriptedProvider]:
    with ScriptedProvider() as provider:
        yield provider


def _call(server: ScriptedProvider, **ours: Any) -> Any:
    client = rateloop.openai_client(
        base_url=server.url + "/v1", api_key="sk-test-key", clock=FakeClock(), timeout=10.0,
        **ours,
    )
    try:
        return client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=50
        )
    finally:
        client.close()


def test_the_default_policy_has_separate_bounds() -> None:
    policy = rl_httpx2.RateLoopTransport(clock=FakeClock()).policy
    assert (policy.max_attempts, policy.recovery_budget_secs) == (20, 600.0)
    assert policy.max_error_attempts == TRANSPORT_ERROR_ATTEMPTS == 5


def test_503s_do_not_spend_the_429_budget(server: ScriptedProvider) -> None:
    server.add(*[Step(503, body=UNAVAILABLE)] * 4, *[Step(429, body=RATE_LIMITED)] * 3)
    raw = _call(server, policy=Policy(max_attempts=4))
    assert raw.http_response.extensions[OUTCOME_KEY].status is Status.COMPLETED
    assert server.count() == 8  # 4 errors + 3 throttles + the success, under max_attempts=4


def test_errors_stop_at_their_own_bound(server: ScriptedProvider) -> None:
    server.default = Step(503, body=UNAVAILABLE)
    with pytest.raises(openai.InternalServerError) as caught:
        _call(server)
    assert server.count() == TRANSPORT_ERROR_ATTEMPTS
    outcome = caught.value.response.extensions[OUTCOME_KEY]
    assert outcome.status is Status.FAILED_RETRY_EXHAUSTED
    assert "max_error_attempts 5" in outcome.reason


def test_max_attempts_1_turns_off_only_429_retries(server: ScriptedProvider) -> None:
    server.add(Step(503, body=UNAVAILABLE), Step(drop=True))
    raw = _call(server, policy=Policy(max_attempts=1))
    assert raw.parse().choices[0].message.content == "hello"
    assert server.count() == 3
    server.add(Step(429, body=RATE_LIMITED))
    with pytest.raises(openai.RateLimitError):
        _call(server, policy=Policy(max_attempts=1))
    assert server.count() == 4


@pytest.mark.parametrize(
    "step", [Step(429, {"retry-after": "1"}, RATE_LIMITED), Step(503, body=UNAVAILABLE)],
    ids=["429", "503"],
)
def test_policy_enabled_false_sends_the_request_exactly_once(
    server: ScriptedProvider, step: Step
) -> None:
    server.add(step)
    with pytest.raises(openai.APIStatusError) as caught:
        _call(server, policy=Policy(enabled=False))
    assert OUTCOME_KEY not in caught.value.response.extensions
    assert server.count() == 1


def test_policy_enabled_false_in_the_async_client(server: ScriptedProvider) -> None:
    server.add(Step(429, body=RATE_LIMITED))

    async def main() -> None:
        client = rateloop.async_openai_client(
            base_url=server.url + "/v1", api_key="sk-test-key", clock=FakeClock(),
            timeout=10.0, policy=Policy.from_dict({"enabled": False}),
        )
        try:
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        finally:
            await client.close()

    asyncio.run(main())
    assert server.count() == 1


def test_a_loop_passed_in_gets_the_error_bound_too() -> None:
    loop = rateloop.RateLoop(Policy(max_attempts=3), clock=FakeClock())
    transport = rl_httpx2.RateLoopTransport(loop=loop)
    assert transport.policy.max_error_attempts == 5 and transport.policy.max_attempts == 3
    assert rl_httpx2.RateLoopTransport(policy=Policy(max_error_attempts=2)).policy == Policy(
        max_error_attempts=2
    )
