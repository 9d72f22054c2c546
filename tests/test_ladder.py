"""The degrade ladder without I/O: the policy's [ladder] table, the chain of rungs, the decider.

The decider is called directly on a :class:`LoopState` with an explicit
monotonic ``now`` (no clock, no sleep); the loop over HTTP is
tests/test_ladder_loop.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from rateloop.errors import ConfigError
from rateloop.integrations._request import read_request
from rateloop.loop.effects import observed_scope
from rateloop.outcome.record import Outcome, Status
from rateloop.policy import LadderPolicy, Layer, Policy
from rateloop.route import Route
from rateloop.signal import Kind, LimitSignal
from rateloop.tasks.cli import _cost_line
from rateloop.tasks.model import Checkpoint, CompletedStep, TaskRecord, runtime_summary
from rateloop.tasks.states import PriorityClass, TaskState
from rateloop.timing.backoff import Backoff
from rateloop.timing.budget import CallBudget
from rateloop.timing.decide import FallBack, Proceed, Stop, decide, decide_admission
from rateloop.timing.ladder import ladder_chain, ladder_end, tier_discount
from rateloop.timing.state import Answered, LoopState, start_attempt, take
from test_timing_decide import Settings  # the decider's settings, as the decider reads them

ROUTE = Route(provider="openai", model="gpt-5", project="p", input_price_per_mtok=2.0,
              output_price_per_mtok=8.0)
FLEX, BATCH = ROUTE.with_tier("flex"), ROUTE.with_tier("batch")
BACKUP = Route(provider="anthropic", model="claude", project="p")
EPOCH = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
FULL = ("standard", "flex", "batch", "fallback", "park")


def state_for(ladder: LadderPolicy | None, priority: str, *, deadline: float | None = 30.0,
              fallbacks: tuple[Route, ...] = (BACKUP,)) -> LoopState:
    chain, rungs, plan = ladder_chain(ROUTE, fallbacks, ladder, priority)
    return LoopState(
        chain=chain, rungs=rungs, ladder=plan,
        budget=CallBudget(max_attempts=20, recovery_budget_secs=600.0, started_at=0.0,
                          deadline=deadline),
        backoff=Backoff(initial=5.0, max_delay=60.0, jitter="none", rng=lambda: 0.0),
        epoch=(0.0, EPOCH), answered=Answered(),
    )


def refused(retry_after: float | None = None, **fields: object) -> LimitSignal:
    return LimitSignal.of(Kind.TEMPORARY, status=429, retry_after=retry_after, **fields)


# --- the policy ---------------------------------------------------------------------------------


def test_no_ladder_is_the_default_and_the_recommended_one_loads() -> None:
    assert Policy().ladder == LadderPolicy()
    assert all(LadderPolicy().rungs_for(c) is None
               for c in ("safety", "interactive", "scheduled", "background"))
    policy = Policy.from_dict({"ladder": {"background": list(FULL),
                                          "interactive": ["standard", "flex", "fallback"]}})
    assert policy.ladder.rungs_for("background") == FULL
    assert policy.ladder.rungs_for("nobody") is None
    assert policy.leaves()["ladder.flex_discount"] == 0.5
    env = Policy.layered(Layer.defaults(), Layer.from_env(
        environ={"RATELOOP_LADDER__SCHEDULED": "standard, flex, park"}))
    assert env.ladder.scheduled == ("standard", "flex", "park")


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ({"interactive": ["standard", "batch"]}, "ladder.interactive",
         "rung 'batch' is not allowed here: interactive and safety work never goes to batch"),
        ({"safety": ["batch"]}, "ladder.safety", "rung 'batch' is not allowed here"),
        ({"background": ["standard", "turbo"]}, "ladder.background",
         "unknown rung 'turbo' (the rungs: standard, flex, batch, fallback, park)"),
        ({"scheduled": ["park", "flex"]}, "ladder.scheduled", "'park' must be the last"),
        ({"scheduled": ["flex", "flex"]}, "ladder.scheduled", "rung 'flex' is listed twice"),
        ({"scheduled": []}, "ladder.scheduled", "needs at least one rung"),
        ({"deferrable": ["bulk"]}, "ladder.deferrable", "unknown value 'bulk'"),
        ({"flex_discount": 1.5}, "ladder.flex_discount", "invalid value 1.5"),
        ({"rungs": ["standard"]}, "ladder.rungs", "unknown key 'rungs'"),
    ],
)
def test_a_bad_ladder_is_a_config_error_at_load(table: object, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.from_dict({"ladder": table})
    assert key in str(info.value) and words in str(info.value)
    with pytest.raises(ConfigError, match="never goes to batch"):
        LadderPolicy(interactive=("batch",))  # built in code: the same check


def test_a_route_table_names_a_known_tier() -> None:
    policy = Policy.from_dict({"fallback": {"routes": [
        {"provider": "openai", "model": "m", "tier": "flex"}]}})
    assert policy.fallback.routes[0].tier == "flex"
    with pytest.raises(ConfigError, match=r"fallback\.routes\[0\]\.tier: invalid value 'turbo'"):
        Policy.from_dict({"fallback": {"routes": [
            {"provider": "openai", "model": "m", "tier": "turbo"}]}})
    with pytest.raises(ValueError, match=r"Route\.tier must be one of standard, flex, batch"):
        Route(provider="openai", model="m", tier="priority")


# --- the route ----------------------------------------------------------------------------------


def test_a_tier_has_scopes_of_its_own_and_a_discounted_price() -> None:
    assert FLEX.scopes == ("openai:gpt-5~flex", "openai:gpt-5~flex:p")
    assert FLEX.provider_scope == "openai:gpt-5~flex:p" != ROUTE.provider_scope
    assert ROUTE.with_tier("standard") is ROUTE and FLEX.model == ROUTE.model
    assert ROUTE.price_usd(1_000_000, 1_000_000, discount=0.5) == pytest.approx(5.0)
    assert Route(provider="openai", model="m").price_usd(10, 10) is None
    assert tier_discount(LadderPolicy(batch_discount=0.25), "batch") == 0.25
    assert tier_discount(LadderPolicy(), "standard") == tier_discount(None, "flex") == 0.0


def test_a_flex_refusal_speaks_for_the_flex_scope_only() -> None:
    flex_out = refused(code="flex_unavailable", scope="tier:flex")
    assert observed_scope(flex_out, FLEX) == "openai:gpt-5~flex:p"
    # Even a route that did not know it was flex (a hand-set service_tier): never standard's.
    assert observed_scope(flex_out, ROUTE) == "openai:gpt-5~flex:p"
    assert observed_scope(refused(), FLEX) == "openai:gpt-5~flex:p"
    assert observed_scope(refused(scope="tier:nonsense"), ROUTE) == "openai:gpt-5:p"


def test_the_transport_reads_the_tier_from_the_request() -> None:
    body = b'{"model": "gpt-5", "max_tokens": 5, "messages": [], "service_tier": "flex"}'
    plan = read_request("POST", "https://api.openai.com/v1/chat/completions",
                        {"authorization": "Bearer sk-x"}, body)
    assert plan.route.tier == "flex" and "~flex" in plan.route.scope
    plain = read_request("POST", "https://api.openai.com/v1/chat/completions",
                         {"authorization": "Bearer sk-x"}, body.replace(b"flex", b"auto"))
    assert plain.route.tier == "standard"


# --- the chain of rungs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ladder", "priority", "rungs", "chain"),
    [
        (None, "background", ("standard", "fallback"), (ROUTE, BACKUP)),
        (LadderPolicy(), "background", ("standard", "fallback"), (ROUTE, BACKUP)),
        (LadderPolicy(scheduled=FULL), "scheduled",
         ("standard", "flex", "batch", "fallback"), (ROUTE, FLEX, BATCH, BACKUP)),
        # Deferrable: the cheapest rung first, the ones it skipped after it.
        (LadderPolicy(background=FULL), "background",
         ("flex", "standard", "batch", "fallback"), (FLEX, ROUTE, BATCH, BACKUP)),
        (LadderPolicy(background=("standard", "batch"), flex_discount=0.6), "background",
         ("batch", "standard"), (BATCH, ROUTE)),
        (LadderPolicy(background=("standard", "flex"), flex_discount=0.0), "background",
         ("standard", "flex"), (ROUTE, FLEX)),
        (LadderPolicy(scheduled=("flex", "standard"), deferrable=("scheduled",)), "scheduled",
         ("flex", "standard"), (FLEX, ROUTE)),
        (LadderPolicy(interactive=("standard", "park")), "interactive", ("standard",), (ROUTE,)),
        (LadderPolicy(interactive=("park",)), "interactive", ("standard",), (ROUTE,)),
    ],
)
def test_the_ladder_becomes_the_chain(
    ladder: LadderPolicy | None, priority: str, rungs: tuple[str, ...], chain: tuple[Route, ...],
) -> None:
    got_chain, got_rungs, plan = ladder_chain(ROUTE, (BACKUP,), ladder, priority)
    assert (got_rungs, got_chain) == (rungs, chain)
    assert (plan is None) == (ladder is None or ladder.rungs_for(priority) is None)


# --- the decider --------------------------------------------------------------------------------


def test_a_standard_wait_past_the_deadline_moves_to_flex_at_once() -> None:
    state = state_for(LadderPolicy(scheduled=FULL), "scheduled", deadline=30.0)
    assert start_attempt(state)
    step = decide(state, refused(retry_after=60.0), Settings(), 1.0)
    assert isinstance(step, FallBack) and (step.route, step.wait) == (FLEX, 0.0)
    # Without the ladder the same refusal moves to the fallback: today's chain.
    plain = state_for(None, "scheduled", deadline=30.0)
    assert start_attempt(plain)
    moved = decide(plain, refused(retry_after=60.0), Settings(), 1.0)
    assert isinstance(moved, FallBack) and moved.route == BACKUP


def test_flex_unavailable_retries_flex_while_the_deadline_allows_then_moves_on() -> None:
    flex_out = refused(code="flex_unavailable", scope="tier:flex")
    for deadline, expected in ((300.0, "wait"), (4.0, "move")):
        state = state_for(LadderPolicy(background=FULL), "background", deadline=deadline)
        assert state.route == FLEX and start_attempt(state)
        step = decide(state, flex_out, Settings(), 1.0)
        if expected == "wait":  # the backoff (5 s) fits: flex again, as OpenAI's guide says
            assert type(step).__name__ == "Wait" and step.route == FLEX  # type: ignore[union-attr]
        else:  # the deadline is near: back to the standard tier at once
            assert isinstance(step, FallBack) and (step.route, step.wait) == (ROUTE, 0.0)


def test_reaching_batch_hands_the_call_over() -> None:
    state = state_for(LadderPolicy(scheduled=FULL), "scheduled")
    take(state, FallBack(FLEX, 0.0, "", 1), Kind.TEMPORARY)
    assert start_attempt(state)
    # Flex's attempts are spent (attempts_per_route 1): the next rung is batch, with no backoff.
    step = decide(state, refused(code="flex_unavailable"), Settings(attempts_per_route=1), 2.0)
    assert isinstance(step, FallBack) and (step.route, step.wait) == (BATCH, 0.0)
    take(state, step, Kind.TEMPORARY)
    stop = decide(state, None, Settings(), 2.0)
    assert isinstance(stop, Stop)
    assert (stop.status, stop.next_rung) == (Status.WAITING_FOR_CAPACITY, "batch")
    assert state.rung == "batch" and "batch API" in stop.reason


def test_admission_past_the_deadline_moves_down_the_ladder() -> None:
    @dataclass(frozen=True)
    class Refusal:
        retry_after: float = 120.0
        never_fits: bool = False
        scope: str = ROUTE.scope
        reason: str = "no capacity"

    state = state_for(LadderPolicy(scheduled=("standard", "flex")), "scheduled")
    step = decide_admission(state, Refusal(), Settings(), 0.0)
    assert isinstance(step, FallBack) and step.route == FLEX
    take(state, step, None)
    last = decide_admission(state, Refusal(), Settings(), 0.0)
    assert isinstance(last, Stop) and last.status is Status.FAILED_RETRY_EXHAUSTED
    assert "scheduled ladder (standard, flex) has no park rung" in last.reason


def test_the_end_of_a_ladder_parks_only_with_park() -> None:
    waiting = Stop(Status.WAITING_FOR_CAPACITY, "no capacity", retry_in=60.0)
    parks = state_for(LadderPolicy(scheduled=("standard", "park")), "scheduled").ladder
    fails = state_for(LadderPolicy(scheduled=("standard",)), "scheduled").ladder
    assert ladder_end(waiting, parks).next_rung == "park"
    assert ladder_end(waiting, None) is waiting  # no ladder: today's stop
    ended = ladder_end(waiting, fails)
    assert ended.status is Status.FAILED_RETRY_EXHAUSTED and "no park rung" in ended.reason
    reset = Stop(Status.WAITING_FOR_RESET, "day quota")
    assert ladder_end(reset, fails) is reset  # only waits for capacity are the ladder's
    assert decide(state_for(None, "scheduled"), None, Settings(), 0.0) == Proceed(ROUTE)


# --- what it cost -------------------------------------------------------------------------------


def test_the_task_summary_and_list_sum_the_cost_by_rung() -> None:
    steps = (
        CompletedStep(index=0, name="a", status="completed", rung="flex", cost_usd=0.003),
        CompletedStep(index=1, name="b", status="degraded", rung="fallback", cost_usd=0.001),
        CompletedStep(index=2, name="c", status="completed"),  # unpriced
    )
    ck = Checkpoint(task_id="t1", run_id="r1", workflow_version="1", completed_steps=steps)
    assert Checkpoint.from_json(ck.to_json()).completed_steps == steps
    assert "cost_usd" not in steps[2].to_dict()  # unpriced steps keep their shape
    rec = TaskRecord(task_id="t1", name="job", state=TaskState.COMPLETED,
                     priority=PriorityClass.BACKGROUND, args={}, steps=("a", "b", "c"),
                     checkpoint=ck, created_at=EPOCH, updated_at=EPOCH, next_attempt_at=None)
    summary = runtime_summary(rec)
    assert summary["cost_usd"] == pytest.approx(0.004)
    assert summary["cost_by_rung"] == {"fallback": 0.001, "flex": 0.003}
    assert _cost_line([rec, rec]) == "cost $0.0080 (fallback $0.0020, flex $0.0060)"
    assert _cost_line([]) is None


def test_the_outcome_says_its_rung_and_cost() -> None:
    out = Outcome(status=Status.COMPLETED, reason="ok", route=FLEX, rung="flex", cost_usd=0.0015)
    assert "rung=flex" in repr(out) and "cost=$0.001500" in repr(out)
    handed = Outcome(status=Status.WAITING_FOR_CAPACITY, reason="r", rung="batch",
                     next_rung="batch")
    assert "next_rung=batch" in repr(handed)
