"""A provider batch as a durable task step, on the FakeProvider over real HTTP, in virtual time.

The fake, the runner and the step share one FakeClock: a batch that takes an
hour is done when the test moves the clock an hour.  Nothing sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rateloop.admission import HeldCapacity, Limiter, LimitSpec
from rateloop.outcome.record import Status
from rateloop.route import Route
from rateloop.tasks import StepContext, TaskRecord, TaskRegistry, TaskRunner, open_store, task
from rateloop.tasks._batch_wire import submission_tag
from rateloop.tasks.batch import AnthropicBatches, BatchSettings, BatchStep, OpenAIBatches
from rateloop.testing import FakeBatch, FakeClock, FakeProvider, FakeProviderServer

ROUTE = Route(provider="openai", model="gpt-x", project="p1")
SCOPE = "openai:gpt-x:p1:batch"


def openai_body(words: int = 4, max_tokens: int = 10) -> dict[str, Any]:
    return {"model": "gpt-x", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "word " * words}]}


def anthropic_body(words: int = 4, max_tokens: int = 10) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "word " * words}]}


def wire(task_id: str, round_: int, position: int, step: str = "batch") -> str:
    """The custom_id the step gives item ``position`` of round ``round_`` (fail_ids use it)."""
    return f"{submission_tag(f'{task_id}:{step}:r{round_}')}-{position}"


@dataclass
class Bench:
    """A fake on a FakeClock over HTTP, a SQLite store and a runner on the same clock."""

    tmp: Path
    batch: FakeBatch
    clock: FakeClock = field(default_factory=FakeClock)
    limits: Mapping[str, LimitSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fake = FakeProvider(batch=self.batch, output_ratio=0.5, clock=self.clock)
        self.server = FakeProviderServer(self.fake).start()
        self.store = open_store(f"sqlite:///{self.tmp}/tasks.db", clock=self.clock)
        self.tasks = TaskRegistry()
        self.runner = TaskRunner(self.store, tasks=self.tasks, clock=self.clock)
        self.queue = HeldCapacity(Limiter(limits=dict(self.limits), clock=self.clock))
        self.providers: list[OpenAIBatches | AnthropicBatches] = []

    def provider(self, flavor: str) -> OpenAIBatches | AnthropicBatches:
        kind = OpenAIBatches if flavor == "openai" else AnthropicBatches
        made = kind(api_key="sk-fake", base_url=self.server.url, timeout=10)
        self.providers.append(made)
        return made

    def define(self, flavor: str, name: str = "digest", **settings: Any) -> None:
        t = task(name, into=self.tasks)
        t.step("batch")(BatchStep(
            provider=self.provider(flavor), route=ROUTE, queue=self.queue, clock=self.clock,
            items=lambda ctx: ctx.args["items"],
            settings=BatchSettings(first_poll_secs=60, max_poll_secs=600, **settings)))

    def run(self, *, max_wakes: int = 60) -> list[TaskRecord]:
        """Run every task to its end, moving the clock to each parked task's next attempt."""
        for _ in range(max_wakes):
            self.runner.run_until_idle()
            records = sorted(self.store.list_tasks(), key=lambda r: r.task_id)
            waiting = [r for r in records if r.state.waiting]
            if not waiting:
                return records
            due = min(r.next_attempt_at for r in waiting)
            self.clock.advance(max((due - self.clock.now()).total_seconds(), 0.0))
        raise AssertionError(f"not done after {max_wakes} wakes: {self.store.list_tasks()}")

    def close(self) -> None:
        for made in self.providers:
            made.close()
        self.store.close()
        self.server.stop()


@pytest.fixture
def bench(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Bench]:
    kwargs = dict(getattr(request, "param", {}))
    limits = kwargs.pop("limits", {})
    b = Bench(tmp_path, FakeBatch(**kwargs), limits=limits)
    try:
        yield b
    finally:
        b.close()


def on(**kwargs: Any) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("bench", [kwargs], indirect=True, ids=["fake"])


def text_of(flavor: str, value: Any) -> bool:
    if flavor == "openai":
        return value["object"] == "chat.completion"
    return value["type"] == "message"


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@on(delay=600, item_seconds=5, context_window=200, fail_ids={wire("t1", 0, 1)})
def test_partial_failures_retry_only_the_failed_items(bench: Bench, flavor: str) -> None:
    body = openai_body if flavor == "openai" else anthropic_body
    bench.define(flavor)
    items = {"a": body(), "b": body(), "huge": body(words=400), "c": body()}
    bench.runner.submit("digest", {"items": items}, task_id="t1", priority="background")
    done = bench.run()[0]
    assert done.state.value == "completed"
    value = done.result
    assert value["status"] == {"a": "succeeded", "b": "succeeded", "huge": "failed",
                               "c": "succeeded"}
    assert all(text_of(flavor, value["results"][i]) for i in "abc")
    # over the model's limits: failed alone with the provider's reason, not retried
    words = {"openai": "400 context_length_exceeded: This model's maximum context length",
             "anthropic": "invalid_request_error: prompt is too long"}[flavor]
    assert value["errors"]["huge"].startswith(words) and "huge" not in value["results"]
    # b failed with a 500 in round 1 and alone went again, in a second batch
    assert value["rounds"] == 2 and len(value["batches"]) == 2
    assert bench.fake.stats.batches == 2
    assert sum(bench.fake.stats.batch_items.values()) == 4 + 1
    assert value["pricing"]["discount"] == 0.5 and value["provider"] == flavor
    ledger = done.checkpoint.attempts_used
    # parked between polls with backoff: 600 s of batch at 60, 120, 240, 480 s polls
    assert ledger.wakes >= 3 and done.checkpoint.step_progress is None


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@on(delay=60, item_seconds=10, completion_window=95)
def test_an_expired_batch_keeps_its_finished_items_and_requeues_the_rest(
        bench: Bench, flavor: str) -> None:
    body = openai_body if flavor == "openai" else anthropic_body
    bench.define(flavor)
    items = {f"i{n}": body() for n in range(5)}
    bench.runner.submit("digest", {"items": items}, task_id="t1")
    done = bench.run()[0]
    assert set(done.result["status"].values()) == {"succeeded"}
    # round 1 expired at 95 s with 4 items done; only the last one went in round 2
    assert bench.fake.stats.batches == 2 and done.result["rounds"] == 2
    assert bench.fake.stats.batch_items["expired"] == 1
    assert bench.fake.stats.batch_items["succeeded"] == 5


@on(delay=60)
def test_a_rejected_input_file_fails_the_bad_lines_and_resubmits_the_others(
        bench: Bench) -> None:
    bench.define("openai")
    items: dict[str, Any] = {"a": openai_body(), "bad": '{"model": "gpt-x", oops',
                             "c": openai_body()}
    bench.runner.submit("digest", {"items": items}, task_id="t1")
    done = bench.run()[0]
    assert done.result["status"] == {"a": "succeeded", "bad": "failed", "c": "succeeded"}
    assert done.result["errors"]["bad"].startswith("line 2: invalid_json_line")
    assert bench.fake.stats.batches == 2  # the refused one, then a and c alone


@on(delay=600, limits={SCOPE: LimitSpec(enqueued_tokens=60)})
def test_the_enqueued_token_limit_is_held_while_a_batch_runs_and_released_after(
        bench: Bench) -> None:
    bench.define("openai")
    items = {"a": openai_body(), "b": openai_body()}  # ~27 tokens each by the estimate
    for tid in ("t1", "t2"):
        bench.runner.submit("digest", {"items": items}, task_id=tid)
    bench.runner.run_until_idle()
    held = bench.queue.held(SCOPE)
    assert 0 < held <= 60 and bench.fake.stats.batches == 1  # t2 could not hold its tokens
    t2 = bench.store.get("t2")
    assert t2.state.value == "waiting_for_capacity" and "enqueued tokens" in t2.checkpoint.reason
    records = bench.run()
    assert [r.state.value for r in records] == ["completed", "completed"]
    assert bench.fake.stats.batches == 2 and bench.queue.held(SCOPE) == 0


@on(delay=60, limits={SCOPE: LimitSpec(enqueued_tokens=40)})
def test_items_over_the_enqueued_limit_fail_and_the_rest_go_in_rounds_that_fit(
        bench: Bench) -> None:
    bench.define("openai")
    items = {"a": openai_body(), "b": openai_body(), "big": openai_body(words=100)}
    bench.runner.submit("digest", {"items": items}, task_id="t1")
    done = bench.run()[0]
    assert done.result["status"] == {"a": "succeeded", "b": "succeeded", "big": "failed"}
    assert "over the enqueued-token limit 40" in done.result["errors"]["big"]
    assert bench.fake.stats.batches == 2  # a, then b: each alone fits 40


@on(delay=60, enqueued_tokens=30)
def test_the_providers_own_queue_refusal_waits_and_counts_no_round(bench: Bench) -> None:
    bench.define("openai", max_rounds=1)
    items = {"a": openai_body(words=20)}  # 25 input tokens: one batch at a time fits 30
    for tid in ("t1", "t2"):
        bench.runner.submit("digest", {"items": items}, task_id=tid)
    records = bench.run()
    assert [r.result["status"] for r in records] == [{"a": "succeeded"}] * 2
    assert bench.fake.stats.batches == 3  # t2's first batch was refused token_limit_exceeded


class CrashAfterSubmit:
    """A provider whose first submit lands and then "kills" the worker before it saves."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.crashed = inner, inner.name, False

    def submit(self, *args: Any) -> str:
        batch_id: str = self.inner.submit(*args)
        if not self.crashed:
            self.crashed = True
            raise SystemExit("killed")  # the worker dies: its batch id is never saved
        return batch_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def context(progress: Any, saved: list[Any]) -> StepContext:
    return StepContext(task_id="t1", step="batch", index=0, args={}, results={},
                       idempotency_key="t1:batch", delivery=1, progress=progress,
                       saver=saved.append)


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@on(delay=300)
def test_a_crash_between_submit_and_checkpoint_never_submits_twice(
        bench: Bench, flavor: str) -> None:
    body = openai_body if flavor == "openai" else anthropic_body
    items = {"a": body(), "b": body()}
    step = BatchStep(provider=CrashAfterSubmit(bench.provider(flavor)), route=ROUTE,
                     items=lambda ctx: items, clock=bench.clock,
                     settings=BatchSettings(first_poll_secs=60))
    saved: list[Any] = []
    with pytest.raises(SystemExit):
        step(context(None, saved))
    mark = saved[-1]["pending"]
    assert mark["batch_id"] is None and bench.fake.stats.batches == 1  # marked, then sent

    bench.clock.advance(30)  # the lease expires; another worker takes the task
    out = step(context(saved[-1], saved))
    assert out.status is Status.WAITING_FOR_CAPACITY
    if flavor == "openai":  # the batch's metadata names the key: adopted at once
        assert saved[-1]["pending"]["batch_id"] is not None
    else:  # a running message batch cannot be told apart until it ends
        assert saved[-1]["pending"]["batch_id"] is None and "may be it" in out.reason
    while out.status is Status.WAITING_FOR_CAPACITY:
        assert out.retry_at is not None
        bench.clock.advance((out.retry_at - bench.clock.now()).total_seconds())
        out = step(context(saved[-1], saved))
    assert out.status is Status.COMPLETED
    assert out.value["status"] == {"a": "succeeded", "b": "succeeded"}
    assert bench.fake.stats.batches == 1 and len(out.value["batches"]) == 1  # exactly once


@on()
def test_progress_round_trips_through_the_checkpoint_and_bad_items_are_named(
        bench: Bench) -> None:
    step = BatchStep(provider=bench.provider("openai"), route=ROUTE, clock=bench.clock,
                     items=lambda ctx: ctx.args["items"])
    for items, words in (({}, "non-empty mapping"), ({"a": 3}, "item 'a'"),
                         ({"a": "{\n}"}, "one line"), ({"": {}}, "non-empty string")):
        ctx = StepContext(task_id="t", step="s", index=0, args={"items": items}, results={},
                          idempotency_key="t:s", delivery=1, saver=lambda p: None)
        with pytest.raises(ValueError, match=words):
            step(ctx)
    with pytest.raises(ValueError, match="max_rounds must be an integer >= 1, got 0"):
        BatchSettings(max_rounds=0)
    with pytest.raises(ValueError, match="first_poll_secs must be a number of seconds > 0"):
        BatchSettings(first_poll_secs=-1)
    assert "sk-fake" not in repr(step) and "sk-fake" not in repr(bench.provider("anthropic"))
    json.dumps(step.queue_scope)


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@on(delay=20 * 3600)
def test_a_batch_that_takes_most_of_its_window_completes_on_the_default_settings(
    bench: Bench, flavor: str
) -> None:
    """Polling a batch is not a retry: ~47 polls of a 20-hour batch on the default backoff
    (60 s doubling to 30 min) must not spend the task's retry budget (20 by default)."""
    body = openai_body if flavor == "openai" else anthropic_body
    t = task("slow-digest", into=bench.tasks)
    t.step("batch")(BatchStep(provider=bench.provider(flavor), route=ROUTE, queue=bench.queue,
                              clock=bench.clock, items=lambda ctx: ctx.args["items"]))
    bench.runner.submit("slow-digest", {"items": {"a": body()}}, task_id="t1",
                        priority="background")
    done = bench.run(max_wakes=200)[0]
    assert done.state.value == "completed", done.checkpoint
    assert done.result["status"] == {"a": "succeeded"}
    ledger = done.checkpoint.attempts_used
    assert ledger.wakes > 20  # every poll is a wake, counted, and none spent the budget
    assert done.checkpoint.retry_budget_remaining == 20
