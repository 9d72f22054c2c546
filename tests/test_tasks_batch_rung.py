"""A task step whose call reaches the ladder's batch rung, sent to the batch API (flow rule 8).

The FakeProvider serves the synchronous call and the batch endpoints over real
HTTP; the fake, the loop, the store and the runner share one FakeClock, so the
batch's hour passes when the test moves the clock.  Nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rateloop import AsyncRateLoop, Limiter, Policy, RateLoop, Route
from rateloop.admission import HeldCapacity, LimitSpec
from rateloop.cli import app
from rateloop.route import Cost
from rateloop.tasks import (
    AsyncTaskRunner,
    TaskRecord,
    TaskRegistry,
    TaskRunner,
    open_store,
    task,
)
from rateloop.tasks.batch import AnthropicBatches, BatchSettings, OpenAIBatches
from rateloop.tasks.batch_rung import BatchRung
from rateloop.tasks.model import Checkpoint
from rateloop.testing import FakeBatch, FakeClock, FakeProvider, FakeProviderServer

MAIN = Route(provider="openai", model="gpt-big", project="p", input_price_per_mtok=2.0,
             output_price_per_mtok=8.0)
CLAUDE = Route(provider="anthropic", model="claude-big", project="p", input_price_per_mtok=3.0,
               output_price_per_mtok=15.0)
BULK = {"background": ["standard", "batch", "park"], "deferrable": []}
SIX_HOURS = 6 * 3600.0


def body(route: Route, max_tokens: int = 40) -> dict[str, Any]:
    return {"model": route.model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "summarise the ticket " * 20}]}


@dataclass
class Bench:
    """One fake (standard tier and batch endpoints) over HTTP, a store, a runner: one clock."""

    tmp: Path
    batch: FakeBatch = field(default_factory=lambda: FakeBatch(delay=3600))
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.fake = FakeProvider(rpm=1, batch=self.batch, output_ratio=0.5, clock=self.clock)
        self.server = FakeProviderServer(self.fake).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=10)
        self.url = f"sqlite:///{self.tmp}/tasks.db"
        self.store = open_store(self.url, clock=self.clock)
        self.limiter = Limiter(clock=self.clock, limits={
            s: LimitSpec(enqueued_tokens=100_000)
            for s in ("openai:gpt-big~batch:p", "anthropic:claude-big~batch:p")})
        self.tasks = TaskRegistry()
        self.providers: list[OpenAIBatches | AnthropicBatches] = []
        self.sync_calls: list[str] = []

    def call(self, route: Route) -> Any:
        """The step's synchronous call on ``route`` (what the batch rung replaces)."""
        self.sync_calls.append(route.scope)
        path = "/v1/chat/completions" if route.provider == "openai" else "/v1/messages"
        answer = self.http.post(path, json=body(route))
        answer.raise_for_status()
        return answer.json()

    def spend_standard(self, route: Route) -> None:
        """The standard tier serves one request a minute (the fake's clock stands still)."""
        self.call(route)
        self.sync_calls.clear()

    def rung(self, route: Route, **kw: Any) -> BatchRung:
        kind = OpenAIBatches if route.provider == "openai" else AnthropicBatches
        made = kind(api_key="sk-fake", base_url=self.server.url, timeout=10)
        self.providers.append(made)
        return BatchRung(provider=made, request=lambda ctx, r: body(r),
                         settings=BatchSettings(first_poll_secs=600, max_poll_secs=1800), **kw)

    def define(self, route: Route, *, batch: BatchRung | None, name: str = "summary") -> None:
        t = task(name, into=self.tasks)
        t.step("summarise", route=route, cost=Cost(input_tokens=100, output_tokens=40),
               batch=batch)(lambda ctx, r: self.call(r))

    def runner(self, ladder: dict[str, Any], *, leave_after_one: bool = True,
               **policy: Any) -> TaskRunner:
        """A runner whose loop walks ``ladder`` (by default one refused attempt leaves a rung)."""
        if leave_after_one:
            policy["attempts_per_route"] = 1
        loop = RateLoop(Policy.from_dict({"ladder": ladder, **policy}), clock=self.clock,
                        limiter=self.limiter, sinks=[])
        return TaskRunner(self.store, tasks=self.tasks, clock=self.clock, loop=loop)

    def get(self, task_id: str) -> TaskRecord:
        rec = self.store.get(task_id)
        assert rec is not None
        return rec

    def run_to_end(self, runner: TaskRunner, task_id: str, *, max_wakes: int = 20) -> TaskRecord:
        """Run the task, moving the clock to each of its wakes, until it stops waiting."""
        runner.run_until_idle()
        for _ in range(max_wakes):
            rec = self.get(task_id)
            if not rec.state.waiting:
                return rec
            self.clock.advance((rec.next_attempt_at - self.clock.now()).total_seconds())
            runner.run_until_idle()
        raise AssertionError(f"still waiting after {max_wakes} wakes: {self.get(task_id)}")

    def close(self) -> None:
        for provider in self.providers:
            provider.close()
        self.http.close()
        self.store.close()
        self.server.stop()


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    made = Bench(tmp_path)
    yield made
    made.close()


def held(bench: Bench, route: Route) -> int:
    return HeldCapacity(bench.limiter).held(route.with_tier("batch").scope)


@pytest.mark.parametrize("route", [MAIN, CLAUDE], ids=["openai", "anthropic"])
def test_a_step_on_the_batch_rung_is_served_by_the_batch_api(bench: Bench, route: Route) -> None:
    bench.define(route, batch=bench.rung(route))
    runner = bench.runner(BULK)
    bench.spend_standard(route)
    rec = runner.submit("summary", priority="background", deadline=SIX_HOURS)

    runner.run_until_idle()  # standard refuses: handed to the batch rung, submitted, parked
    parked = bench.get(rec.task_id)
    assert parked.state.value == "waiting_for_capacity", parked.checkpoint.reason
    assert parked.checkpoint.batch_route == route.with_tier("batch")
    assert parked.checkpoint.pending_operation is not None
    assert parked.checkpoint.pending_operation.scope == route.with_tier("batch").scope
    assert bench.sync_calls == [route.scope]  # one refused call, then nothing synchronous
    assert bench.fake.stats.batches == 1
    assert held(bench, route) > 0  # the batch-tier scope holds the enqueued tokens

    done = bench.run_to_end(runner, rec.task_id)
    # The standard tier refilled long ago: the step still never ran synchronously again.
    assert bench.sync_calls == [route.scope]
    assert bench.fake.stats.batches == 1
    assert done.state.value == "degraded"  # batch was not the call's first rung
    step = done.checkpoint.completed_steps[0]
    assert (step.name, step.status, step.rung) == ("summarise", "degraded", "batch")
    answer = step.result  # the provider's response body, mapped back to the step
    usage = answer["usage"]
    tokens = ((usage["prompt_tokens"], usage["completion_tokens"]) if route is MAIN
              else (usage["input_tokens"], usage["output_tokens"]))
    full = route.price_usd(*tokens)
    assert full is not None and full > 0
    assert step.cost_usd == pytest.approx(full * 0.5)  # the policy's batch_discount
    assert done.checkpoint.batch_route is None and done.checkpoint.step_progress is None
    assert held(bench, route) == 0  # released when the batch ended

    shown = CliRunner().invoke(app, ["tasks", "show", rec.task_id, "--store", bench.url])
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["cost_by_rung"] == {"batch": pytest.approx(full * 0.5)}
    assert data["checkpoint"]["completed_steps"][0]["rung"] == "batch"
    assert "summarise the ticket" not in shown.output  # the prompt is never shown


def test_the_result_maps_back_and_a_first_rung_batch_is_not_degraded(bench: Bench) -> None:
    # Deferrable work starts on its cheapest rung: batch, before any synchronous call.
    answers: list[dict[str, Any]] = []

    def text(answer: dict[str, Any]) -> str:
        answers.append(answer)
        return str(answer["choices"][0]["message"]["content"])

    bench.define(MAIN, batch=bench.rung(MAIN, result=text))
    runner = bench.runner({"background": ["standard", "batch"], "deferrable": ["background"],
                           "batch_discount": 0.25})
    rec = runner.submit("summary", priority="background", deadline=SIX_HOURS)
    done = bench.run_to_end(runner, rec.task_id)
    assert bench.sync_calls == [] and bench.fake.stats.attempts == 0
    assert done.state.value == "completed"
    step = done.checkpoint.completed_steps[0]
    assert (step.status, step.rung) == ("completed", "batch")
    assert isinstance(step.result, str) and step.result  # the answer's text
    assert step.cost_usd is not None and step.cost_usd > 0
    # 25 % off: three quarters of the full price of the tokens the batch reported.
    [usage] = [answer["usage"] for answer in answers]
    full = MAIN.price_usd(usage["prompt_tokens"], usage["completion_tokens"])
    assert step.cost_usd == pytest.approx(0.75 * (full or 0))


def test_the_async_runner_sends_it_to_the_batch_api_too(bench: Bench) -> None:
    async def summarise(ctx: object, route: Route) -> Any:
        bench.sync_calls.append(route.scope)
        async with httpx.AsyncClient(base_url=bench.server.url, timeout=10) as http:
            answer = await http.post("/v1/chat/completions", json=body(route))
        answer.raise_for_status()
        return answer.json()

    task("summary", into=bench.tasks).step(
        "summarise", route=MAIN, batch=bench.rung(MAIN))(summarise)
    policy = Policy.from_dict({"ladder": BULK, "attempts_per_route": 1})
    loop = AsyncRateLoop(policy, clock=bench.clock, limiter=bench.limiter, sinks=[])
    runner = AsyncTaskRunner(bench.store, tasks=bench.tasks, clock=bench.clock, loop=loop)
    bench.spend_standard(MAIN)

    async def main() -> TaskRecord:
        rec = await runner.submit("summary", priority="background", deadline=SIX_HOURS)
        await runner.run_until_idle()
        while (now := bench.get(rec.task_id)).state.waiting:
            bench.clock.advance((now.next_attempt_at - bench.clock.now()).total_seconds())
            await runner.run_until_idle()
        return bench.get(rec.task_id)

    done = asyncio.run(main())
    assert done.state.value == "degraded", done.checkpoint.reason
    assert done.checkpoint.completed_steps[0].rung == "batch"
    assert bench.sync_calls == [MAIN.scope] and bench.fake.stats.batches == 1


def test_the_park_rung_still_parks(bench: Bench) -> None:
    bench.define(MAIN, batch=bench.rung(MAIN))
    # The standard tier's next slot is two minutes away, past the pause limit: park.
    runner = bench.runner({"background": ["standard", "park"]}, leave_after_one=False,
                          pause_limit_secs=10)
    bench.spend_standard(MAIN)
    rec = runner.submit("summary", priority="background", deadline=SIX_HOURS)
    runner.run_until_idle()
    parked = bench.get(rec.task_id)
    assert parked.state.value == "waiting_for_capacity"
    assert parked.checkpoint.batch_route is None and bench.fake.stats.batches == 0
    wait = (parked.next_attempt_at - bench.clock.now()).total_seconds()
    assert 10 < wait <= 121  # the standard tier's next slot, not a batch poll
    done = bench.run_to_end(runner, rec.task_id)
    assert done.state.value == "completed"
    assert done.checkpoint.completed_steps[0].rung == "standard"
    assert bench.fake.stats.batches == 0


def test_without_batch_a_step_handed_to_the_batch_rung_parks(bench: Bench) -> None:
    bench.define(MAIN, batch=None)
    runner = bench.runner(BULK)
    bench.spend_standard(MAIN)
    rec = runner.submit("summary", priority="background", deadline=SIX_HOURS)
    runner.run_until_idle()
    parked = bench.get(rec.task_id)
    assert parked.state.value == "waiting_for_capacity"
    assert "batch rung" in parked.checkpoint.reason
    assert parked.checkpoint.batch_route is None and bench.fake.stats.batches == 0


def test_an_item_the_provider_rejects_ends_the_step_with_its_reason(tmp_path: Path) -> None:
    bench = Bench(tmp_path, batch=FakeBatch(delay=600, max_output_tokens=16))
    try:
        bench.define(MAIN, batch=bench.rung(MAIN))
        runner = bench.runner(BULK)
        bench.spend_standard(MAIN)
        rec = runner.submit("summary", priority="background", deadline=SIX_HOURS)
        done = bench.run_to_end(runner, rec.task_id)
        assert done.state.value == "needs_operator"
        assert "on the batch rung (openai:gpt-big~batch:p)" in done.checkpoint.reason
        assert "max_tokens is too large" in done.checkpoint.reason
        # An operator's retry walks the ladder again instead of replaying the failed batch.
        assert done.checkpoint.batch_route is None and done.checkpoint.step_progress is None
        assert held(bench, MAIN) == 0
    finally:
        bench.close()


def test_the_batch_route_survives_the_checkpoint_round_trip() -> None:
    route = MAIN.with_tier("batch")
    tagged = Route(provider="openai", model="m", tags=frozenset({"pii", "eu"}), tier="batch",
                   context_window=8000)
    for r in (route, tagged):
        ck = Checkpoint(task_id="t", run_id="r", workflow_version="1", batch_route=r)
        assert Checkpoint.from_json(ck.to_json()).batch_route == r
    plain = Checkpoint(task_id="t", run_id="r", workflow_version="1")
    assert "batch_route" not in plain.to_json()  # older checkpoints keep their shape


def test_bad_batch_options_are_refused_with_the_reason() -> None:
    tasks = TaskRegistry()
    t = task("t", into=tasks)
    rung = BatchRung(provider=OpenAIBatches(api_key="sk-x", base_url="http://127.0.0.1:9"),
                     request=lambda ctx, r: {})
    with pytest.raises(ValueError, match="batch= needs a route"):
        t.step("a", batch=rung)(lambda ctx: None)
    with pytest.raises(TypeError, match="batch= must be a BatchRung"):
        t.step("b", route=MAIN, batch="yes")(lambda ctx, r: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"BatchRung\.request must be callable, got dict"):
        BatchRung(provider=rung.provider, request={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"BatchRung\.settings must be a BatchSettings, got dict"):
        BatchRung(provider=rung.provider, request=rung.request,
                  settings={"max_rounds": 2})  # type: ignore[arg-type]
