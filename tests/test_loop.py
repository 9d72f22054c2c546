"""The RATE loop: the failure matrix and crab'd's runWithFallback scenarios, on a fake clock.

Every scenario runs through both twins (``RateLoop`` and ``AsyncRateLoop``) and
asserts the calls that reached ``fn``, the final state and the waits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from rateloop.errors import SdkRetriesWarning
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.outcome import Outcome, Status
from rateloop.outcome.events import LoggingSink, RecordingSink
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.signal import Kind
from rateloop.testing import FakeClock, FaultScript
from rateloop.timing.writes import WriteOutcome

OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC = "https://api.anthropic.com/v1/messages"

A = Route(provider="openai", model="a")
B = Route(provider="openai", model="b")
C = Route(provider="openai", model="c")


def response(
    status: int, body: Any = None, headers: dict[str, str] | None = None, url: str = OPENAI
) -> httpx.Response:
    request = httpx.Request("POST", url)
    if body is None:
        return httpx.Response(status, headers=headers, request=request)
    return httpx.Response(status, headers=headers, json=body, request=request)


def http_error(
    status: int, body: Any = None, headers: dict[str, str] | None = None, url: str = OPENAI
) -> httpx.HTTPStatusError:
    resp = response(status, body, headers, url)
    return httpx.HTTPStatusError(f"HTTP {status}", request=resp.request, response=resp)


def openai_429(
    message: str = "Rate limit reached", code: str = "rate_limit_exceeded"
) -> dict[str, Any]:
    return {"error": {"message": message, "type": "requests", "param": None, "code": code}}


OK = response(200, {"id": "chatcmpl-1", "usage": {"prompt_tokens": 10, "completion_tokens": 5}})


def policy(**overrides: Any) -> Policy:
    data: dict[str, Any] = {"backoff": {"jitter": "none"}}
    backoff = overrides.pop("backoff", None)
    if backoff:
        data["backoff"].update(backoff)
    data.update(overrides)
    return Policy.from_dict(data)


CRABD = {"backoff": {"initial_delay_secs": 2, "max_delay_secs": 30, "multiplier": 2}}


Runner = Callable[..., Outcome]


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest, clock: FakeClock) -> Runner:
    """Run one call through the sync or the async twin, on the fake clock."""

    def runner(fn: Any, *, policy: Policy | None = None, sink: Any = None, **kw: Any) -> Outcome:
        sinks = [sink] if sink is not None else []
        if request.param == "sync":
            return RateLoop(policy, clock=clock, sinks=sinks, rng=lambda: 0.5).call(fn, **kw)
        loop = AsyncRateLoop(policy, clock=clock, sinks=sinks, rng=lambda: 0.5)
        return asyncio.run(loop.call(fn, **kw))

    return runner


# --- the failure matrix ------------------------------------------------------------


def test_numeric_retry_after_is_a_floor_plus_bounded_jitter(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([http_error(429, openai_429(), {"retry-after": "7"}), OK])
    out = run(fn, route=A, policy=policy(backoff={"jitter": "equal"}))
    assert out.status is Status.COMPLETED
    assert len(fn.calls) == 2
    (wait,) = clock.sleeps
    local_max = 5.0  # initial 5, equal jitter: local in [2.5, 5]
    assert 7.0 <= wait <= 7.0 + local_max / 2
    assert out.attempts.loop == 2


def test_http_date_retry_after(run: Runner, clock: FakeClock) -> None:
    when = format_datetime(clock.now() + timedelta(seconds=30), usegmt=True)
    fn = FaultScript([http_error(429, openai_429(), {"retry-after": when}), OK])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert len(fn.calls) == 2
    assert clock.sleeps[0] >= 30.0


@pytest.mark.parametrize("headers", [{"retry-after": "soon-ish"}, {}])
def test_malformed_or_missing_header_falls_back_to_backoff(
    run: Runner, clock: FakeClock, headers: dict[str, str]
) -> None:
    fn = FaultScript([http_error(429, openai_429(), headers), OK])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert clock.sleeps == [5.0]  # initial_delay_secs 5, no jitter


def test_token_dimension_throttle_waits_what_the_message_says(
    run: Runner, clock: FakeClock
) -> None:
    msg = (
        "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 30000, Used 29000, Requested 1500. Please try again in 10.5s."
    )
    fn = FaultScript([http_error(429, openai_429(msg)), OK])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert clock.sleeps[0] >= 10.5
    first = out.events[0]
    assert first.signal_kind == "temporary"


def test_daily_quota_waits_for_reset_without_short_retry(run: Runner, clock: FakeClock) -> None:
    msg = "Rate limit reached for gpt-4o on requests per day (RPD): Limit 200, Used 200."
    fn = FaultScript([http_error(429, openai_429(msg))])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.WAITING_FOR_RESET
    assert len(fn.calls) == 1
    assert clock.sleeps == []
    assert out.retry_at is not None and out.retry_at > clock.now()


def test_spend_limit_needs_an_operator(run: Runner, clock: FakeClock) -> None:
    body = openai_429(
        "You exceeded your current quota, please check your plan and billing details.",
        code="insufficient_quota",
    )
    fn = FaultScript([http_error(429, body)])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.NEEDS_OPERATOR
    assert out.signal is not None and out.signal.kind is Kind.SPEND
    assert len(fn.calls) == 1 and clock.sleeps == []


def test_bad_request_is_invalid_after_one_call(run: Runner, clock: FakeClock) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    fn = FaultScript([http_error(400, body, url=ANTHROPIC)])
    out = run(fn, route=A, fallbacks=[B], policy=policy(attempts_per_route=1))
    assert out.status is Status.INVALID
    assert fn.models == ["a"]  # surfaced, no switch
    assert clock.sleeps == []


def test_forbidden_needs_an_operator_after_one_call(run: Runner, clock: FakeClock) -> None:
    body = {"type": "error", "error": {"type": "permission_error", "message": "no"}}
    fn = FaultScript([http_error(403, body, url=ANTHROPIC)])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.NEEDS_OPERATOR
    assert len(fn.calls) == 1


def test_sdk_internal_retries_are_counted(run: Runner) -> None:
    class Raw:
        status_code = 200
        headers: dict[str, str] = {}  # noqa: RUF012
        text = "{}"
        retries_taken = 2

    fn = FaultScript([Raw()])
    with pytest.warns(SdkRetriesWarning, match="max_retries=0"):
        out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert (out.attempts.loop, out.attempts.sdk) == (1, 2)
    assert out.attempts.provider_requests == 3


def test_sdk_retries_read_from_the_stainless_header_of_a_real_openai_error(run: Runner) -> None:
    openai = pytest.importorskip("openai")
    request = httpx.Request("POST", OPENAI, headers={"x-stainless-retry-count": "3"})
    resp = httpx.Response(429, json=openai_429(), request=request)
    err = openai.RateLimitError("Rate limit reached", response=resp, body=openai_429()["error"])
    fn = FaultScript([err, OK])
    with pytest.warns(SdkRetriesWarning):
        out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert out.attempts.sdk == 3
    assert out.attempts.provider_requests == 5


def test_deadline_too_close_for_the_servers_wait(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([http_error(429, openai_429(), {"retry-after": "30"})])
    out = run(fn, route=A, policy=policy(), deadline=5.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert clock.sleeps == []
    assert out.retry_at == clock.now() + timedelta(seconds=30)
    assert len(fn.calls) == 1


def test_pause_limit_stops_instead_of_holding_the_process(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([http_error(429, openai_429(), {"retry-after": "7200"})])
    out = run(fn, route=A, policy=policy())
    # A wait beyond the pause limit is a spent period allowance (the far-wait rule).
    assert out.status is Status.WAITING_FOR_RESET
    assert clock.sleeps == []


def test_fallback_that_fails_its_checks_is_skipped(run: Runner, clock: FakeClock) -> None:
    small = Route(provider="openai", model="small", context_window=1000)
    other = Route(provider="mistral", model="m")
    ok = Route(provider="openai", model="ok")
    sink = RecordingSink()
    fn = FaultScript({"a": [http_error(429, openai_429())], "ok": [OK]})
    out = run(
        fn,
        route=A,
        fallbacks=[small, other, ok],
        cost=Cost(input_tokens=5000),
        policy=policy(attempts_per_route=1, fallback={"allowed_providers": ["openai"]}),
        sink=sink,
    )
    assert out.status is Status.DEGRADED
    assert fn.models == ["a", "ok"]
    skips = [e for e in sink.events if e.decision == "skip"]
    assert [e.model for e in skips] == ["small", "m"]
    assert "context window" in (skips[0].reason or "")
    assert "allowlist" in (skips[1].reason or "")
    assert out.reason == "Primary model a was rate-limited — completed with ok"
    assert out.limited_route == A


def test_every_fallback_failing_its_checks_exhausts(run: Runner) -> None:
    fn = FaultScript([http_error(429, openai_429())])
    tagged = Route(provider="openai", model="t", tags=frozenset({"public"}))
    out = run(
        fn,
        route=A,
        fallbacks=[tagged],
        data_class="pii",
        policy=policy(attempts_per_route=1),
    )
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert fn.models == ["a"]
    assert any(e.decision == "skip" and e.model == "t" for e in out.events)


def test_period_quota_moves_only_to_another_provider(run: Runner) -> None:
    msg = "Rate limit reached on requests per day (RPD): Limit 200, Used 200."
    same = Route(provider="openai", model="b")
    other = Route(provider="anthropic", model="claude")
    fn = FaultScript({"a": [http_error(429, openai_429(msg))], "claude": [OK]})
    out = run(fn, route=A, fallbacks=[same, other], policy=policy())
    assert out.status is Status.DEGRADED
    assert fn.models == ["a", "claude"]


# --- writes ------------------------------------------------------------------------


def _timeout() -> httpx.ReadTimeout:
    return httpx.ReadTimeout("read timed out", request=httpx.Request("POST", OPENAI))


def test_unknown_write_outcome_without_a_check_needs_an_operator(
    run: Runner, clock: FakeClock
) -> None:
    fn = FaultScript([_timeout(), OK])
    out = run(fn, route=A, idempotent=False, policy=policy())
    assert out.status is Status.NEEDS_OPERATOR
    assert "unknown_outcome" in out.reason
    assert len(fn.calls) == 1 and clock.sleeps == []


@pytest.mark.parametrize(
    ("verdict", "status", "calls"),
    [
        (WriteOutcome.APPLIED, Status.COMPLETED, 1),
        (True, Status.COMPLETED, 1),
        (WriteOutcome.NOT_APPLIED, Status.COMPLETED, 2),
        (WriteOutcome.UNKNOWN, Status.NEEDS_OPERATOR, 1),
        (None, Status.NEEDS_OPERATOR, 1),
    ],
)
def test_unknown_write_outcome_with_a_check(
    run: Runner, verdict: object, status: Status, calls: int
) -> None:
    checks: list[Route] = []

    def check(route: Route) -> object:
        checks.append(route)
        return verdict

    fn = FaultScript([_timeout(), OK])
    out = run(fn, route=A, idempotent=False, outcome_check=check, policy=policy())
    assert out.status is status
    assert len(fn.calls) == calls
    assert checks == [A]


def test_controlled_retry_happens_once(run: Runner) -> None:
    fn = FaultScript([_timeout()])
    out = run(
        fn,
        route=A,
        idempotent=False,
        outcome_check=lambda r: WriteOutcome.NOT_APPLIED,
        policy=policy(),
    )
    assert out.status is Status.NEEDS_OPERATOR
    assert len(fn.calls) == 2


def test_a_refused_connection_is_not_an_ambiguous_write(run: Runner) -> None:
    refused = httpx.ConnectError("refused", request=httpx.Request("POST", OPENAI))
    # The endpoint has answered in this process: its refusal is retried (rule 3a).
    assert run(FaultScript([OK]), route=A, policy=policy()).ok
    fn = FaultScript([refused, OK])
    out = run(fn, route=A, idempotent=False, policy=policy())
    assert out.status is Status.COMPLETED
    assert len(fn.calls) == 2


def test_a_write_is_not_replayed_on_a_fallback_once_it_may_have_taken_effect(
    run: Runner,
) -> None:
    fn = FaultScript({"a": [_timeout()], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], idempotent=False, policy=policy(attempts_per_route=1))
    assert out.status is Status.NEEDS_OPERATOR
    assert fn.models == ["a"]


def test_idempotency_key_is_passed_on_every_attempt(run: Runner) -> None:
    fn = FaultScript([http_error(429, openai_429()), OK])
    out = run(fn, route=A, idempotency_key="k-123", policy=policy())
    assert out.ok
    assert fn.kwargs == [{"idempotency_key": "k-123"}, {"idempotency_key": "k-123"}]


# --- crab'd's runWithFallback ------------------------------------------------------


def test_crabd_primary_succeeds(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([OK])
    out = run(fn, route=A, fallbacks=[B], policy=policy(attempts_per_route=1, **CRABD))
    assert out.status is Status.COMPLETED
    assert out.attempts.loop == 1
    assert clock.sleeps == []
    assert out.events == ()


def test_crabd_primary_limited_fallback_completes(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript({"a": [http_error(429, openai_429())], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], policy=policy(attempts_per_route=1, **CRABD))
    assert out.status is Status.DEGRADED
    assert out.route == B
    assert clock.sleeps == [2.0]
    assert out.value is OK
    assert "Primary model a was rate-limited" in out.reason


def test_crabd_every_route_limited(run: Runner) -> None:
    fn = FaultScript([http_error(429, openai_429())])
    out = run(fn, route=A, fallbacks=[B], policy=policy(attempts_per_route=1, **CRABD))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert out.attempts.loop == 2


def test_crabd_one_second_budget_never_reaches_c(run: Runner, clock: FakeClock) -> None:
    overloaded = http_error(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        url=ANTHROPIC,
    )
    fn = FaultScript([overloaded])
    out = run(
        fn,
        route=A,
        fallbacks=[B, C],
        policy=policy(attempts_per_route=1, max_wait_secs=1, **CRABD),
    )
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert out.attempts.loop == 2
    assert clock.sleeps == [1.0]
    assert "c" not in fn.models


def test_crabd_invalid_request_is_surfaced_without_a_switch(run: Runner) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    fn = FaultScript([http_error(400, body, url=ANTHROPIC)])
    out = run(fn, route=A, fallbacks=[B], policy=policy(attempts_per_route=1, **CRABD))
    assert out.status is Status.INVALID
    assert out.attempts.loop == 1


# --- exits, scopes, raising ----------------------------------------------------------


def test_retries_run_out_after_max_attempts(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([http_error(429, openai_429())])
    out = run(fn, route=A, policy=policy(max_attempts=4))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert len(fn.calls) == 4
    assert clock.sleeps == [5.0, 10.0, 20.0]


def test_server_error_outside_rate_limit_scope_is_not_retried(run: Runner) -> None:
    fn = FaultScript([http_error(500, {"error": {"message": "boom"}}), OK])
    out = run(fn, route=A, policy=policy(trigger_scope="rate-limit"))
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    assert "outside trigger_scope" in out.reason
    assert len(fn.calls) == 1


def test_server_error_is_retried_in_the_default_scope(run: Runner) -> None:
    fn = FaultScript([http_error(500, {"error": {"message": "boom"}}), OK])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert len(fn.calls) == 2


def test_a_bug_in_user_code_propagates(run: Runner) -> None:
    fn = FaultScript([KeyError("missing")])
    with pytest.raises(KeyError):
        run(fn, route=A, policy=policy())
    assert len(fn.calls) == 1


def test_returned_http_response_is_classified(run: Runner) -> None:
    fn = FaultScript([response(429, openai_429(), {"retry-after": "1"}), OK])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.COMPLETED
    assert out.value is OK
    assert len(fn.calls) == 2


def test_user_classify_hook_replaces_classify_exception(clock: FakeClock) -> None:
    from rateloop.signal import LimitSignal

    class Busy(Exception):
        pass

    seen: list[BaseException] = []

    def hook(exc: BaseException) -> LimitSignal:
        seen.append(exc)
        return LimitSignal.of(Kind.TEMPORARY, retry_after=3)

    loop = RateLoop(policy(), clock=clock, classify=hook, rng=lambda: 0.0)
    out = loop.call(FaultScript([Busy(), "done"]), route=A)
    assert out.status is Status.COMPLETED and out.value == "done"
    assert len(seen) == 1 and clock.sleeps == [5.0]  # max(local 5, server 3) + U(0, 2.5)·0


def test_call_or_raise_and_soft_exhaustion(clock: FakeClock) -> None:
    from rateloop.errors import RateLimitExhausted

    fn = FaultScript([http_error(429, openai_429())])
    hard = RateLoop(policy(max_attempts=2), clock=clock)
    with pytest.raises(RateLimitExhausted) as info:
        hard.call_or_raise(fn, route=A)
    assert info.value.outcome.status is Status.FAILED_RETRY_EXHAUSTED
    soft = RateLoop(policy(max_attempts=2, on_exhausted="soft"), clock=clock)
    out = soft.call_or_raise(fn, route=A)
    assert out.status is Status.FAILED_RETRY_EXHAUSTED
    with pytest.raises(RateLimitExhausted):  # soft never hides a spend limit
        soft.call_or_raise(
            FaultScript([http_error(429, openai_429("x", code="insufficient_quota"))]), route=A
        )


def test_decorator_forms(clock: FakeClock) -> None:
    loop = RateLoop(policy(), clock=clock)
    fn = FaultScript([http_error(429, openai_429()), "ok"])

    @loop.wrap(route=A)
    def ask(route: Route, question: str) -> str:
        return f"{fn(route)}:{route.model}:{question}"

    assert ask("q") == "ok:a:q"

    aloop = AsyncRateLoop(policy(), clock=clock)

    @aloop.wrap(route=B)
    async def aask(route: Route, n: int) -> str:
        return f"{route.model}{n}"

    assert asyncio.run(aask(3)) == "b3"


def test_sync_loop_refuses_a_coroutine_function(clock: FakeClock) -> None:
    async def fn(route: Route) -> str:
        return "x"

    with pytest.raises(TypeError, match="AsyncRateLoop"):
        RateLoop(policy(), clock=clock).call(fn, route=A)


# --- events ------------------------------------------------------------------------


def test_events_never_carry_keys_or_prompts(
    run: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-proj-Zx81SECRETSECRETSECRET0000"
    prompt = "Summarise the confidential merger memo"
    request = httpx.Request(
        "POST", OPENAI, headers={"authorization": f"Bearer {secret}"}, json={"prompt": prompt}
    )
    resp = httpx.Response(
        429,
        headers={"x-request-id": f"req-{secret}"},
        json={"error": {"message": f"limit for {prompt} key {secret}", "code": secret}},
        request=request,
    )
    err = httpx.HTTPStatusError(f"{prompt} {secret}", request=request, response=resp)
    sink = RecordingSink()
    caplog.set_level(logging.INFO, logger="rateloop.events")

    def both(event: Any) -> None:
        sink(event)
        LoggingSink()(event)

    fn = FaultScript([err, err, OK])
    out = run(fn, route=A, policy=policy(), sink=both)
    assert out.ok
    assert sink.events, "the loop must have emitted events"
    for text in [e.to_json() for e in sink.events] + [r.getMessage() for r in caplog.records]:
        assert "sk-proj" not in text and "SECRET" not in text
        assert "merger" not in text and "confidential" not in text
    assert caplog.records and json.loads(caplog.records[0].getMessage())["decision"] == "wait"


def test_one_event_per_decision(run: Runner) -> None:
    sink = RecordingSink()
    fn = FaultScript([http_error(429, openai_429(), {"retry-after": "2"}), OK])
    out = run(fn, route=A, policy=policy(), sink=sink)
    assert out.ok
    assert sink.decisions == ["wait", "retry", "success_after_retry"]
    wait = sink.events[0]
    assert wait.http_status == 429 and wait.retry_after_seconds == 2.0
    assert wait.wait_seconds is not None and wait.wait_seconds >= 2.0
    assert wait.next_attempt_at is not None
    assert wait.provider == "openai" and wait.model == "a" and wait.attempt == 1


def test_run_budget_bounds_attempts_across_the_calls_of_a_task(clock: FakeClock) -> None:
    from rateloop.timing.budget import RunBudget

    run_budget = RunBudget(5)
    loop = RateLoop(policy(max_attempts=3), clock=clock, run_budget=run_budget)
    fn = FaultScript([http_error(429, openai_429()), OK] * 4)
    statuses = [loop.call(fn, route=A).status for _ in range(4)]
    # Each call resets its own per-call count after a success, yet the task stops at 5.
    assert len(fn.calls) == 5
    assert statuses[:2] == [Status.COMPLETED, Status.COMPLETED]
    assert statuses[2] is Status.FAILED_RETRY_EXHAUSTED
    assert statuses[3] is Status.FAILED_RETRY_EXHAUSTED


def test_backoff_past_the_deadline_is_not_taken(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([http_error(429, openai_429()), OK])  # no header: backoff of 5 s
    out = run(fn, route=A, policy=policy(), deadline=2.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert clock.sleeps == []
    assert len(fn.calls) == 1
    assert out.retry_at == clock.now() + timedelta(seconds=5)


def test_a_deadline_already_passed_makes_no_attempt(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([OK])
    out = run(fn, route=A, policy=policy(), deadline=-5.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert fn.calls == [] and clock.sleeps == []


def test_period_quota_is_surfaced_under_the_rate_limit_scope(run: Runner) -> None:
    msg = "Rate limit reached on requests per day (RPD): Limit 200, Used 200."
    other = Route(provider="anthropic", model="claude")
    fn = FaultScript({"a": [http_error(429, openai_429(msg))], "claude": [OK]})
    out = run(fn, route=A, fallbacks=[other], policy=policy(trigger_scope="rate-limit"))
    assert out.status is Status.WAITING_FOR_RESET
    assert fn.models == ["a"]


def test_retry_at_is_never_earlier_than_the_server_asked(run: Runner, clock: FakeClock) -> None:
    fn = FaultScript([http_error(429, openai_429(), {"retry-after": "99999"})])
    out = run(fn, route=A, policy=policy())
    assert out.status is Status.WAITING_FOR_RESET
    assert out.retry_at is not None
    assert out.retry_at >= clock.now() + timedelta(seconds=99999)


def test_degraded_reason_names_what_happened(run: Runner) -> None:
    fn = FaultScript({"a": [http_error(500, {"error": {"message": "boom"}})], "b": [OK]})
    out = run(fn, route=A, fallbacks=[B], policy=policy(attempts_per_route=1))
    assert out.status is Status.DEGRADED
    assert out.reason == "Primary model a failed with a server error — completed with b"


def test_an_unknown_call_option_is_named(clock: FakeClock) -> None:
    with pytest.raises(TypeError, match=r"unknown call option\(s\) retries; allowed: booked, cost"):
        RateLoop(policy(), clock=clock).call(lambda r: "x", route=A, retries=3)  # type: ignore[call-arg]


def test_a_naive_deadline_is_refused(clock: FakeClock) -> None:
    from datetime import datetime

    with pytest.raises(ValueError, match="aware datetime"):
        RateLoop(policy(), clock=clock).call(lambda r: "x", route=A, deadline=datetime(2030, 1, 1))


@pytest.mark.parametrize("rng", [0.0, 0.5, 1.0])
def test_jittered_waits_never_run_into_the_deadline(clock: FakeClock, rng: float) -> None:
    fn = FaultScript([http_error(503, {"error": {"message": "unavailable"}})])
    loop = RateLoop(Policy(), clock=clock, rng=lambda: rng)  # default: equal jitter
    out = loop.call(fn, route=A, deadline=8.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert out.retry_at is not None and out.retry_at > clock.now()
    assert sum(clock.sleeps) < 8.0  # no wait that ends at or after the deadline is taken
    assert len(fn.calls) == len(clock.sleeps) + 1


def test_a_passed_deadline_reports_when_to_retry(run: Runner, clock: FakeClock) -> None:
    out = run(FaultScript([OK]), route=A, policy=policy(), deadline=0.0)
    assert out.status is Status.WAITING_FOR_CAPACITY
    assert out.retry_at == clock.now()
