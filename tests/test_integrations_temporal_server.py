"""rateloop inside Temporal activities against a REAL Temporal dev server.

One dev server (``temporal server start-dev``, offline) serves the module; each test runs
its own in-process worker on its own task queue and bounds every wait.  Providers are
scripted functions (deterministic) or a ``FakeProviderServer`` over HTTP.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import httpx
import pytest

pytest.importorskip("temporalio")

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rateloop import AsyncRateLoop, Policy, RateLoop, Route
from rateloop.integrations.temporal import (
    ActivityReport,
    RateLoopInterceptor,
    aactivity_call,
    activity_call,
    connect,
)
from rateloop.testing.temporal import temporal_dev_server

pytestmark = pytest.mark.temporal

ROUTE = Route(provider="openai", model="gpt-4o-mini")
BOUND_SECS = 30  # no test waits longer for its workflow


@pytest.fixture(scope="module")
def temporal_target() -> Iterator[str]:
    """A dev server for this module, stopped at its end (skip, or fail in CI, without it)."""
    from conftest import _unavailable

    try:
        server = temporal_dev_server()
        target = server.__enter__()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        _unavailable("the Temporal dev server (temporal server start-dev)", exc)
    try:
        yield target
    finally:
        server.__exit__(None, None, None)


def refusal(status: int, headers: dict[str, str] | None = None, body: Any = None
            ) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    response = httpx.Response(status, headers=headers or {}, json=body or {}, request=request)
    return httpx.HTTPStatusError(f"status {status}", request=request, response=response)


class Script:
    """Scripted provider answers (an exception is raised); thread-safe; the last repeats."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.calls = list(answers), 0
        self._lock = threading.Lock()

    def __call__(self, route: Route, **_: Any) -> Any:
        with self._lock:
            self.calls += 1
            answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer


@workflow.defn(sandboxed=False)
class OneActivity:
    """Runs the activity named in its input once, with the retry policy given."""

    @workflow.run
    async def run(self, name: str, heartbeat_secs: float, max_attempts: int) -> Any:
        return await workflow.execute_activity(
            name,
            start_to_close_timeout=timedelta(seconds=20),
            schedule_to_close_timeout=timedelta(seconds=BOUND_SECS),
            heartbeat_timeout=timedelta(seconds=heartbeat_secs) if heartbeat_secs else None,
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200),
                                     maximum_attempts=max_attempts),
        )


@workflow.defn(name="ModelCall", sandboxed=False)
class ModelCall:
    @workflow.run
    async def run(self) -> Any:
        return await workflow.execute_activity(
            "invoke_model_activity", {"model_name": "gpt-4o-mini"},
            start_to_close_timeout=timedelta(seconds=20),
            retry_policy=RetryPolicy(maximum_attempts=1))


def run_workflow(target: str, activities: Sequence[Callable[..., Any]], name: str, *,
                 heartbeat_secs: float = 0.0, max_attempts: int = 0,
                 interceptors: Sequence[Any] = ()) -> Any:
    """Start a worker, run OneActivity(name) to its end (bounded), stop the worker."""

    async def main() -> Any:
        client = await Client.connect(target)
        queue = f"rateloop-test-{uuid.uuid4().hex[:8]}"
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            async with Worker(client, task_queue=queue, workflows=[OneActivity],
                              activities=list(activities), activity_executor=pool,
                              interceptors=list(interceptors),
                              workflow_runner=UnsandboxedWorkflowRunner()):
                return await asyncio.wait_for(client.execute_workflow(
                    OneActivity.run, args=[name, heartbeat_secs, max_attempts],
                    id=queue, task_queue=queue), BOUND_SECS + 10)

    return asyncio.run(main())


def application_error(caught: pytest.ExceptionInfo[WorkflowFailureError]) -> ApplicationError:
    activity_error = caught.value.cause
    assert isinstance(activity_error, ActivityError)
    cause = activity_error.cause
    assert isinstance(cause, ApplicationError)
    return cause


def policy(**values: Any) -> Policy:
    return Policy.from_dict({"pause_limit_secs": 1, **values})


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_far_wait_is_held_by_the_server_then_the_work_finishes(
        temporal_target: str, kind: str) -> None:
    provider = Script(refusal(429, {"retry-after": "2"}), "done")
    reports: list[ActivityReport] = []
    if kind == "sync":
        loop = RateLoop(policy(), sinks=[])

        @activity.defn(name="far")
        def far() -> Any:
            return activity_call(loop, provider, route=ROUTE, on_report=reports.append)
    else:
        aloop = AsyncRateLoop(policy(), sinks=[])

        @activity.defn(name="far")
        async def far() -> Any:
            return await aactivity_call(aloop, provider, route=ROUTE, on_report=reports.append)

    assert run_workflow(temporal_target, [far], "far") == "done"
    assert provider.calls == 2
    assert [r.engine_attempt for r in reports] == [1, 2]
    assert reports[0].asleep_secs == 0.0  # the worker did not sleep: the server held it
    assert reports[0].verdict.delay_secs > 1.9  # type: ignore[union-attr]


def test_a_terminal_outcome_is_not_retried_by_the_server(temporal_target: str) -> None:
    provider = Script(refusal(400, body={"error": {"message": "bad", "type": "invalid"}}))
    loop = RateLoop(policy(), sinks=[])

    @activity.defn(name="bad")
    def bad() -> Any:
        return activity_call(loop, provider, route=ROUTE)

    # maximum_attempts=0: Temporal alone would retry for ever (to the 30 s bound).
    with pytest.raises(WorkflowFailureError) as caught:
        run_workflow(temporal_target, [bad], "bad", max_attempts=0)
    err = application_error(caught)
    assert err.type == "rateloop.invalid" and err.non_retryable
    assert provider.calls == 1


def test_the_attempts_carry_across_engine_attempts_and_stop_at_max_attempts(
        temporal_target: str) -> None:
    # Engine attempt 1: a short wait slept inside, then a far one (2 requests spent).  The
    # failure carries the count to attempt 2, which has 1 left: refused again with no attempt
    # left to wait for, it gives up there (without the carried count it would have had 2).
    provider = Script(refusal(429, {"retry-after": "0.2"}), refusal(429, {"retry-after": "1.5"}))
    reports: list[ActivityReport] = []
    loop = RateLoop(policy(max_attempts=3), sinks=[])

    @activity.defn(name="spend")
    def spend() -> Any:
        return activity_call(loop, provider, route=ROUTE, on_report=reports.append)

    with pytest.raises(WorkflowFailureError) as caught:
        run_workflow(temporal_target, [spend], "spend")
    err = application_error(caught)
    assert err.type == "rateloop.failed_retry_exhausted" and err.non_retryable
    assert provider.calls == 3  # the policy's max_attempts, across three engine attempts
    assert [r.prior_attempts for r in reports] == [0, 2]


def test_short_waits_heartbeat_so_the_attempt_survives_its_heartbeat_timeout(
        temporal_target: str) -> None:
    provider = Script(refusal(429, {"retry-after": "2.5"}), "awake")
    reports: list[ActivityReport] = []
    loop = AsyncRateLoop(policy(pause_limit_secs=5), sinks=[])

    @activity.defn(name="patient")
    async def patient() -> Any:
        return await aactivity_call(loop, provider, route=ROUTE, on_report=reports.append)

    # A 1 s heartbeat timeout: a silent 2.5 s sleep would time the attempt out.
    assert run_workflow(temporal_target, [patient], "patient", heartbeat_secs=1.0) == "awake"
    assert [r.engine_attempt for r in reports] == [1]
    assert reports[0].asleep_secs >= 2.5


def test_the_interceptor_classifies_errors_an_activity_marked_non_retryable(
        temporal_target: str) -> None:
    """The shape of temporalio.contrib.openai_agents' model activity: it turns a provider
    error into a non-retryable ApplicationError by its own rules; rateloop reads the cause."""
    provider = Script(refusal(429, {"retry-after": "0.3"}), "model answer")

    @activity.defn(name="invoke_model_activity")
    async def invoke_model_activity(model_input: dict[str, Any]) -> Any:
        try:
            return provider(ROUTE)
        except httpx.HTTPStatusError as e:
            raise ApplicationError("Non retryable OpenAI error", type="APIStatusError",
                                   non_retryable=True) from e

    seen: list[tuple[str, Any]] = []

    def route_for(activity_type: str, args: Sequence[Any]) -> Route | None:
        seen.append((activity_type, args))
        if activity_type != "invoke_model_activity":
            return None
        return Route(provider="openai", model=str(args[0].get("model_name") or "gpt-4o"))

    interceptor = RateLoopInterceptor(AsyncRateLoop(policy(pause_limit_secs=5), sinks=[]),
                                      route_for=route_for)

    async def main() -> Any:
        client = await Client.connect(temporal_target)
        queue = f"rateloop-test-{uuid.uuid4().hex[:8]}"
        async with Worker(client, task_queue=queue, workflows=[ModelCall],
                          activities=[invoke_model_activity], interceptors=[interceptor],
                          workflow_runner=UnsandboxedWorkflowRunner()):
            return await asyncio.wait_for(
                client.execute_workflow("ModelCall", id=queue, task_queue=queue), BOUND_SECS)

    # Without the interceptor the first 429 ends the workflow (non-retryable, 1 attempt).
    assert asyncio.run(main()) == "model answer"
    assert provider.calls == 2
    assert seen[0] == ("invoke_model_activity", [{"model_name": "gpt-4o-mini"}])


def test_connect_reaches_a_running_server(temporal_target: str) -> None:
    async def main() -> str:
        client = await connect(temporal_target)
        return client.namespace

    assert asyncio.run(main()) == "default"
