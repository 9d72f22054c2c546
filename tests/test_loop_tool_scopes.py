"""A tool's limit holds the tool's scope, never the model route the call was made on.

An agent step on a model route calls GitHub; GitHub answers 403 with
``x-ratelimit-remaining: 0``.  Read names the tool's scope
(``tool:github:core``); the loop (and the ready clients' door) pause that
scope, and the model's scope stays open for every other caller.
"""

from __future__ import annotations

import httpx

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied
from rateloop.classify import classify_exception
from rateloop.integrations._assemble import learn_from_refusal
from rateloop.loop import RateLoop
from rateloop.loop.effects import observed_scope
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock, FaultScript

MODEL = Route(provider="openai", model="gpt-5", project="p1")
GITHUB_CORE = Route(provider="tool", model="github", project="core")
ISSUES = "https://api.github.com/repos/octo/hello/issues"


def github_403(clock: FakeClock, wait: int = 40) -> httpx.HTTPStatusError:
    """GitHub's primary limit as the REST API sends it (see tests/fixtures/classify/tools.yaml)."""
    reset = int(clock.now().timestamp()) + wait
    request = httpx.Request("GET", ISSUES)
    resp = httpx.Response(
        403,
        headers={
            "x-github-request-id": "CDE1:2F3A:1A2B3C:1D2E3F:67890ABC",
            "x-ratelimit-limit": "5000",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-resource": "core",
        },
        json={
            "message": "API rate limit exceeded for user ID 1.",
            "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
        },
        request=request,
    )
    return httpx.HTTPStatusError("403", request=request, response=resp)


def ok() -> httpx.Response:
    return httpx.Response(200, json={"usage": {"prompt_tokens": 1, "completion_tokens": 1}},
                          request=httpx.Request("POST", "https://api.openai.com/v1/responses"))


def test_a_github_403_on_a_tool_call_does_not_pause_the_model_scope() -> None:
    probes: dict[str, list[object]] = {"model": [], "tool": []}

    class Probe(FakeClock):
        """While the loop waits out GitHub's reset, other callers ask for capacity."""

        def sleep(self, seconds: float) -> None:
            probes["model"].append(limiter.try_reserve(MODEL, Cost()))
            probes["tool"].append(limiter.try_reserve(GITHUB_CORE, Cost()))
            super().sleep(seconds)

    clock = Probe()
    limiter = Limiter(limits={MODEL.scope: LimitSpec(requests_per_minute=600)}, clock=clock)
    loop = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), limiter=limiter, clock=clock)
    out = loop.call(FaultScript([github_403(clock), ok()]), route=MODEL)
    assert out.ok
    assert clock.sleeps[0] >= 40.0  # the step itself still waits for the tool it needs
    pauses = [e for e in out.events if e.decision == "pause"]
    assert [e.scope for e in pauses] == ["tool:github:core"]
    # The model scope is open to every other caller; the tool's scope is held.
    assert not isinstance(probes["model"][0], Denied)
    held = probes["tool"][0]
    assert isinstance(held, Denied) and held.retry_after >= 39.0


def test_the_ready_clients_door_holds_the_tool_scope_too(clock: FakeClock) -> None:
    limiter = Limiter(limits={MODEL.scope: LimitSpec(requests_per_minute=600)}, clock=clock)
    learn_from_refusal(limiter, MODEL, github_403(clock), clock.now())
    assert not isinstance(limiter.try_reserve(MODEL, Cost()), Denied)
    assert isinstance(limiter.try_reserve(GITHUB_CORE, Cost()), Denied)


def test_the_scope_a_signal_speaks_for(clock: FakeClock) -> None:
    signal = classify_exception(github_403(clock), now=clock.now())
    assert (signal.provider, signal.scope) == ("github", "tool:github:core")
    assert observed_scope(signal, MODEL) == "tool:github:core"
    # A route on the tool itself keeps its own scope (coarser or the same).
    assert observed_scope(signal, Route(provider="tool", model="github")) == "tool:github"
    assert observed_scope(signal, GITHUB_CORE) == "tool:github:core"
    # A route on the same provider (GitHub Models, say) is that provider's own answer.
    assert observed_scope(signal, Route(provider="github", model="gpt-4o")) == "github:gpt-4o"
    # A model provider's signal names no scope: the route's.
    plain = classify_exception(httpx.HTTPStatusError(
        "429", request=httpx.Request("POST", "https://api.openai.com/v1/responses"),
        response=httpx.Response(429, headers={"retry-after": "3"},
                                request=httpx.Request("POST", "https://api.openai.com/v1/x"))),
        now=clock.now())
    assert plain.scope is None and observed_scope(plain, MODEL) == "openai:gpt-5:p1"
