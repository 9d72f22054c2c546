"""The decider, rule by rule: ``decide`` and its two siblings called directly, no loop, no clock.

Each test is one rule of :mod:`rateloop.timing.decide`'s docstring, as a
table: a loop state built by the state's own transitions
(:mod:`rateloop.timing.state`), a signal, an explicit monotonic ``now``, and
the decision expected.  The settings are a small dataclass, not a ``Policy``:
the decider depends on the :class:`~rateloop.timing.state.LoopSettings`
fields alone.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from rateloop.outcome.record import Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.signal import CONNECT_FAILED, Kind, LimitSignal
from rateloop.timing.backoff import Backoff
from rateloop.timing.budget import CallBudget
from rateloop.timing.decide import (
    ARRIVAL_SLACK_SECS,
    BOOK_HORIZON_SECS,
    Decision,
    FallBack,
    Proceed,
    Stop,
    Wait,
    book_within,
    decide,
    decide_admission,
    decide_write,
)
from rateloop.timing.state import (
    Answered,
    LoopSettings,
    LoopState,
    count_sdk_retries,
    record_answer,
    record_refusal,
    start_attempt,
    take,
    use_controlled_retry,
)
from rateloop.timing.writes import WriteOutcome

PRIMARY = Route(provider="openai", model="gpt-5")
SIBLING = Route(provider="openai", model="gpt-5-mini")  # same provider: same quota and bill
OTHER = Route(provider="anthropic", model="claude")
EPOCH = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)  # the wall-clock time at monotonic 0


def at(seconds: float) -> datetime:
    """The wall-clock time at monotonic ``seconds`` (the state's epoch is 0 -> EPOCH)."""
    return EPOCH + timedelta(seconds=seconds)


@dataclass(frozen=True)
class Fallbacks:
    allowed_providers: frozenset[str] | None = None
    data_class: str | None = None
    max_cost_usd: float | None = None


@dataclass(frozen=True)
class Settings:
    """Just the fields the decider reads."""

    trigger_scope: str = "transient"
    max_attempts: int = 20
    attempts_per_route: int | None = None
    pause_limit_secs: float = 3600.0
    fallback: Fallbacks = field(default_factory=Fallbacks)


def given(
    *chain: Route,
    attempts: int = 1,
    max_attempts: int = 20,
    max_error_attempts: int | None = None,
    deadline: float | None = None,
    max_wait: float | None = None,
    refused_at: float | None = None,
    waits: int = 0,
    rng: float = 0.0,
    answered: bool = False,
) -> LoopState:
    """A call on ``chain`` (default: the primary alone) after ``attempts`` attempts.

    The backoff is 5, 10, 20, ... s without jitter; ``rng`` is the draw of the
    half-spread added to a server minimum.  The endpoints that answered are a
    registry of the state's own (the primary among them when ``answered``).
    """
    budget = CallBudget(
        max_attempts=max_attempts,
        max_error_attempts=max_error_attempts,
        recovery_budget_secs=600.0,
        started_at=0.0,
        deadline=deadline,
        max_wait_secs=max_wait,
    )
    state = LoopState(
        chain=chain or (PRIMARY,),
        budget=budget,
        backoff=Backoff(initial=5.0, max_delay=60.0, jitter="none", rng=lambda: rng),
        epoch=(0.0, EPOCH),
        answered=Answered(),
    )
    if answered:
        record_answer(state, LimitSignal.of(Kind.TEMPORARY, status=429))
    for _ in range(attempts):
        assert start_attempt(state)
    if refused_at is not None:
        record_refusal(state, refused_at, Kind.TEMPORARY)
    for _ in range(waits):
        take(state, Wait(1.0, "", state.route), Kind.TEMPORARY)
    return state


def moved(state: LoopState, kind: Kind | None = Kind.TEMPORARY) -> LoopState:
    """``state`` after falling back to the next route of its chain."""
    take(state, FallBack(state.chain[state.index + 1], 0.0, "", state.index + 1), kind)
    return state


def signal(kind: Kind, **fields: object) -> LimitSignal:
    return LimitSignal.of(kind, **fields)


QUOTA_HIT = "provider 'openai' is the one whose quota or spend limit was hit"


def test_settings_are_a_protocol_a_policy_satisfies() -> None:
    settings: LoopSettings = Policy()  # the loop passes a Policy: mypy --strict checks it in src
    assert decide(given(attempts=0), None, settings, 0.0) == Proceed(PRIMARY)


def test_the_timing_layer_never_imports_the_policy() -> None:
    timing = pathlib.Path(__file__).parents[1] / "src" / "rateloop" / "timing"
    imported: set[str] = set()
    for path in timing.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    assert sorted(m for m in imported if m.startswith("rateloop.policy")) == []


# -- rule 0: before an attempt -----------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "now", "expected"),
    [
        pytest.param(given(attempts=0), 0.0, Proceed(PRIMARY), id="first-attempt"),
        pytest.param(given(attempts=3), 9.0, Proceed(PRIMARY), id="a-retry-with-budget"),
        pytest.param(
            given(attempts=0, deadline=5.0),
            5.0,
            Stop(
                Status.WAITING_FOR_CAPACITY,
                "the deadline passed before an attempt on openai:gpt-5 could start",
                retry_at=at(5.0),
            ),
            id="deadline-passed",
        ),
        pytest.param(
            given(attempts=2, max_attempts=2),
            9.0,
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "no attempt left in the budget for openai:gpt-5 (2 made by this call)",
            ),
            id="budget-spent",
        ),
    ],
)
def test_rule_0_proceed_while_the_budget_and_the_deadline_last(
    state: LoopState, now: float, expected: Decision
) -> None:
    assert expected == decide(state, None, Settings(), now)


# -- rule 1: ok ends the call ------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        pytest.param(given(), Stop(Status.COMPLETED, "completed on openai:gpt-5"), id="primary"),
        pytest.param(
            moved(given(PRIMARY, OTHER)),
            Stop(Status.DEGRADED, "Primary model gpt-5 was rate-limited — completed with claude"),
            id="fallback-after-429",
        ),
        pytest.param(
            moved(given(PRIMARY, OTHER), Kind.OVERLOAD),
            Stop(Status.DEGRADED, "Primary model gpt-5 was overloaded — completed with claude"),
            id="fallback-after-overload",
        ),
        pytest.param(
            moved(given(PRIMARY, OTHER), Kind.PERIOD_QUOTA),
            Stop(
                Status.DEGRADED,
                "Primary model gpt-5 ran out of its period quota — completed with claude",
            ),
            id="fallback-after-quota",
        ),
    ],
)
def test_rule_1_ok_is_completed_on_the_primary_degraded_after(
    state: LoopState, expected: Decision
) -> None:
    assert expected == decide(state, signal(Kind.OK), Settings(), 9.0)


# -- rule 2: period quota and spend never retry the same route ---------------------------

RESET = datetime(2026, 5, 2, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("scope", "state", "sig", "expected"),
    [
        pytest.param(
            "transient",
            given(PRIMARY, SIBLING, OTHER),
            signal(Kind.PERIOD_QUOTA, reset_at=RESET),
            FallBack(
                OTHER,
                0.0,
                "period_quota on openai:gpt-5; falling back to anthropic:claude at once",
                2,
                ((SIBLING, QUOTA_HIT),),
            ),
            id="quota-moves-to-another-provider-at-once",
        ),
        pytest.param(
            "transient",
            given(PRIMARY, OTHER),
            signal(Kind.SPEND),
            FallBack(
                OTHER, 0.0, "spend on openai:gpt-5; falling back to anthropic:claude at once", 1
            ),
            id="spend-moves-to-another-provider-at-once",
        ),
        pytest.param(
            "transient",
            given(PRIMARY, SIBLING),
            signal(Kind.SPEND),
            Stop(
                Status.NEEDS_OPERATOR,
                "spend or billing limit on openai:gpt-5: add credit or raise the cap",
                skipped=((SIBLING, QUOTA_HIT),),
            ),
            id="spend-with-only-the-same-provider-left",
        ),
        pytest.param(
            "rate-limit",
            given(PRIMARY, OTHER),
            signal(Kind.PERIOD_QUOTA, reset_at=RESET),
            Stop(
                Status.WAITING_FOR_RESET,
                f"period quota exhausted on openai:gpt-5; resets at {RESET.isoformat()}",
                retry_at=RESET,
            ),
            id="rate-limit-scope-never-moves-on-a-quota",
        ),
        pytest.param(
            "transient",
            given(),
            signal(Kind.PERIOD_QUOTA, retry_after=120.0),
            Stop(
                Status.WAITING_FOR_RESET,
                f"period quota exhausted on openai:gpt-5; resets at {at(130.0).isoformat()}",
                retry_at=at(130.0),
            ),
            id="quota-reset-from-retry-after",
        ),
        pytest.param(
            "transient",
            given(),
            signal(Kind.PERIOD_QUOTA),
            Stop(
                Status.WAITING_FOR_RESET,
                f"period quota exhausted on openai:gpt-5; resets at {RESET.isoformat()} "
                "(an estimate: the provider gave no reset time)",
                retry_at=RESET,
            ),
            id="quota-reset-estimated-at-utc-midnight",
        ),
    ],
)
def test_rule_2_quota_and_spend_move_to_another_provider_or_stop(
    scope: str, state: LoopState, sig: LimitSignal, expected: Decision
) -> None:
    assert expected == decide(state, sig, Settings(trigger_scope=scope), 10.0)


# -- rule 3: outside the trigger scope ----------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "sig", "expected"),
    [
        pytest.param(
            "transient",
            signal(Kind.INVALID, status=400),
            Stop(Status.INVALID, "the request was refused as invalid (status 400)"),
            id="invalid",
        ),
        pytest.param(
            "transient",
            signal(Kind.PERMISSION, status=403),
            Stop(Status.NEEDS_OPERATOR, "permission refused on openai:gpt-5 (status 403)"),
            id="permission",
        ),
        pytest.param(
            "rate-limit",
            signal(Kind.SERVER_ERROR, status=500),
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "server_error on openai:gpt-5 is outside trigger_scope; not retried",
            ),
            id="5xx-under-rate-limit",
        ),
        pytest.param(
            "transient",
            signal(Kind.UNKNOWN),
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "unknown on openai:gpt-5 is outside trigger_scope; not retried",
            ),
            id="unknown-under-transient",
        ),
    ],
)
def test_rule_3_a_kind_outside_the_scope_is_surfaced(
    scope: str, sig: LimitSignal, expected: Decision
) -> None:
    assert expected == decide(given(PRIMARY, OTHER), sig, Settings(trigger_scope=scope), 1.0)


# -- rule 3a: a connection that never opened, to an endpoint that never answered --------

NEVER_OPENED = signal(Kind.NETWORK, code=CONNECT_FAILED, matched="ConnectError")
UNREACHED = (
    "could not connect to openai:gpt-5, which has not answered in this process "
    "(a wrong base URL, or a server that is not running?); not retried"
)


@pytest.mark.parametrize(
    ("state", "sig", "expected"),
    [
        pytest.param(
            given(),
            NEVER_OPENED,
            Stop(Status.FAILED_RETRY_EXHAUSTED, UNREACHED),
            id="never-answered-stops-at-once",
        ),
        pytest.param(
            given(PRIMARY, OTHER),
            NEVER_OPENED,
            FallBack(OTHER, 0.0, f"{UNREACHED}; falling back to anthropic:claude at once", 1),
            id="never-answered-moves-to-a-fallback-at-once",
        ),
        pytest.param(
            given(answered=True),
            NEVER_OPENED,
            Wait(5.0, "network on openai:gpt-5; backoff", PRIMARY),
            id="answered-before-is-the-networks-weather",
        ),
        pytest.param(
            given(),
            signal(Kind.NETWORK, matched="RemoteProtocolError"),
            Wait(5.0, "network on openai:gpt-5; backoff", PRIMARY),
            id="lost-mid-call-is-retried",
        ),
    ],
)
def test_rule_3a_a_connection_that_never_opened(
    state: LoopState, sig: LimitSignal, expected: Decision
) -> None:
    assert expected == decide(state, sig, Settings(), 1.0)


def test_an_answer_of_any_kind_marks_the_endpoint_and_a_network_failure_does_not() -> None:
    answered = Answered()
    state = given()
    state.answered = answered
    record_answer(state, signal(Kind.NETWORK, code=CONNECT_FAILED))
    record_answer(state, signal(Kind.UNKNOWN))
    assert PRIMARY not in answered
    record_answer(state, signal(Kind.SERVER_ERROR, status=500))
    assert PRIMARY in answered
    # The endpoint is the provider and the project: another model of it has answered too.
    assert SIBLING in answered and OTHER not in answered
    assert Route(provider="openai", model="gpt-5", project="p") not in answered


# -- rule 4: retried while the budget lasts, same route then the next -------------------


def _separate_bounds_spent() -> LoopState:
    state = given(attempts=0, max_attempts=5, max_error_attempts=2)
    for _ in range(2):
        start_attempt(state)
        record_refusal(state, 1.0, Kind.SERVER_ERROR)
    return state


def _sdk_retried() -> LoopState:
    state = given(attempts=1, max_attempts=3)
    count_sdk_retries(state, 2)  # the provider saw three requests
    return state


@pytest.mark.parametrize(
    ("settings", "state", "sig", "expected"),
    [
        pytest.param(
            Settings(),
            given(),
            signal(Kind.TEMPORARY),
            Wait(5.0, "temporary on openai:gpt-5; backoff", PRIMARY),
            id="same-route-by-the-backoff",
        ),
        pytest.param(
            Settings(max_attempts=3),
            given(attempts=3, max_attempts=3),
            signal(Kind.TEMPORARY),
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "temporary persisted on openai:gpt-5: all 3 attempts used",
            ),
            id="attempts-spent",
        ),
        pytest.param(
            Settings(max_attempts=3),
            _sdk_retried(),
            signal(Kind.TEMPORARY),
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "temporary persisted on openai:gpt-5: all 3 attempts used",
            ),
            id="sdk-retries-count",
        ),
        pytest.param(
            Settings(max_attempts=5),
            _separate_bounds_spent(),
            signal(Kind.SERVER_ERROR),
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "server_error persisted on openai:gpt-5: all 2 attempts for network errors, "
                "5xx and overloads used (max_error_attempts 2)",
            ),
            id="error-bound-spent",
        ),
        pytest.param(
            Settings(attempts_per_route=1),
            given(PRIMARY, OTHER),
            signal(Kind.TEMPORARY),
            FallBack(OTHER, 5.0, "temporary on openai:gpt-5; falling back to anthropic:claude", 1),
            id="per-route-bound-moves-on-by-the-backoff",
        ),
        pytest.param(
            Settings(attempts_per_route=1),
            given(),
            signal(Kind.TEMPORARY),
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "temporary persisted on openai:gpt-5: every route of the chain was tried "
                "(1 routes)",
            ),
            id="per-route-bound-with-nowhere-to-go",
        ),
        pytest.param(
            Settings(max_attempts=4),
            given(PRIMARY, OTHER, attempts=2, max_attempts=4),
            signal(Kind.TEMPORARY),
            FallBack(OTHER, 5.0, "temporary on openai:gpt-5; falling back to anthropic:claude", 1),
            id="default-bound-ceil-max-over-routes",
        ),
        pytest.param(
            Settings(max_attempts=4, fallback=Fallbacks(allowed_providers=frozenset({"openai"}))),
            given(PRIMARY, OTHER, attempts=2, max_attempts=4),
            signal(Kind.TEMPORARY),
            Wait(5.0, "temporary on openai:gpt-5; backoff", PRIMARY),
            id="default-bound-keeps-retrying-with-no-eligible-route",
        ),
    ],
)
def test_rule_4_retry_while_the_budget_lasts(
    settings: Settings, state: LoopState, sig: LimitSignal, expected: Decision
) -> None:
    assert expected == decide(state, sig, settings, 1.0)


# -- rule 5: a server minimum is a floor; when it cannot fit, move at once ---------------


@pytest.mark.parametrize(
    ("state", "retry_after", "expected"),
    [
        pytest.param(
            given(),
            30.0,
            Wait(30.0, "temporary on openai:gpt-5; server asked for 30s", PRIMARY),
            id="floor-above-the-backoff",
        ),
        pytest.param(
            given(rng=1.0),
            30.0,
            Wait(32.5, "temporary on openai:gpt-5; server asked for 30s", PRIMARY),
            id="floor-plus-half-the-backoff-spread",
        ),
        pytest.param(
            given(PRIMARY, OTHER),
            7200.0,
            FallBack(
                OTHER,
                0.0,
                "server asked for 7200s, beyond the pause limit of 3600s; "
                "falling back to anthropic:claude at once",
                1,
            ),
            id="beyond-the-pause-limit-falls-back-at-once",
        ),
        pytest.param(
            given(),
            7200.0,
            Stop(
                Status.WAITING_FOR_CAPACITY,
                "server asked for 7200s, beyond the pause limit of 3600s",
                retry_at=at(10.0 + 7200.0),
            ),
            id="beyond-the-pause-limit-alone-stops",
        ),
        pytest.param(
            given(refused_at=0.0),
            900.0,
            Stop(
                Status.WAITING_FOR_CAPACITY,
                "server asked for 900s, beyond the 590s left in the budget",
                retry_at=at(10.0 + 900.0),
            ),
            id="beyond-the-recovery-budget",
        ),
    ],
)
def test_rule_5_a_server_minimum_is_a_floor(
    state: LoopState, retry_after: float, expected: Decision
) -> None:
    sig = signal(Kind.TEMPORARY, retry_after=retry_after)
    assert expected == decide(state, sig, Settings(), 10.0)


# -- rule 6: our own backoff is capped at the pause limit and the budget left -----------


@pytest.mark.parametrize(
    ("pause_limit", "state", "now", "expected"),
    [
        pytest.param(
            10.0,
            given(waits=2),  # the third wait: 20 s by the backoff
            10.0,
            Wait(
                10.0,
                "temporary on openai:gpt-5; backoff capped at 10s (pause limit 10s, budget left)",
                PRIMARY,
            ),
            id="capped-at-the-pause-limit",
        ),
        pytest.param(
            3600.0,
            given(max_wait=12.0),
            10.0,
            Wait(
                2.0,
                "temporary on openai:gpt-5; backoff capped at 2s (pause limit 3600s, budget left)",
                PRIMARY,
            ),
            id="shortened-to-max-wait-left",
        ),
        pytest.param(
            3600.0,
            given(refused_at=0.0),
            600.0,
            Stop(
                Status.FAILED_RETRY_EXHAUSTED,
                "temporary persisted on openai:gpt-5: the time budget is spent",
            ),
            id="recovery-budget-spent",
        ),
    ],
)
def test_rule_6_no_sleep_beyond_the_pause_limit_or_the_budget(
    pause_limit: float, state: LoopState, now: float, expected: Decision
) -> None:
    settings = Settings(pause_limit_secs=pause_limit)
    assert expected == decide(state, signal(Kind.TEMPORARY), settings, now)


# -- rule 7: no wait ends at or after the deadline ---------------------------------------


@pytest.mark.parametrize(
    ("state", "retry_after", "expected"),
    [
        pytest.param(
            given(deadline=9.5, rng=1.0),
            8.0,
            Wait(
                8.75,
                "temporary on openai:gpt-5; server asked for 8s, jitter clamped to end before "
                "the deadline (8.75s)",
                PRIMARY,
            ),
            id="jitter-clamped-floor-kept",
        ),
        pytest.param(
            given(deadline=9.5),
            10.0,
            Stop(
                Status.WAITING_FOR_CAPACITY,
                "a wait of 10s on openai:gpt-5 would end after the deadline",
                retry_at=at(10.0),
            ),
            id="floor-past-the-deadline",
        ),
        pytest.param(
            given(deadline=4.0),
            None,
            Stop(
                Status.WAITING_FOR_CAPACITY,
                "a wait of 5s on openai:gpt-5 would end after the deadline",
                retry_at=at(5.0),
            ),
            id="backoff-past-the-deadline",
        ),
    ],
)
def test_rule_7_honest_deadlines(
    state: LoopState, retry_after: float | None, expected: Decision
) -> None:
    sig = signal(Kind.TEMPORARY, retry_after=retry_after)
    assert expected == decide(state, sig, Settings(), 0.0)


# -- rule 8: admission refused the call ---------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    retry_after: float
    never_fits: bool = False
    scope: str = "openai:gpt-5"
    reason: str = "requests"


NO_CAPACITY = (
    "no capacity on openai:gpt-5 before the deadline, the budget or the pause limit (requests)"
)


@pytest.mark.parametrize(
    ("state", "refusal", "expected"),
    [
        pytest.param(
            given(attempts=0),
            Refusal(0.0, never_fits=True, reason="cost above the TPM burst"),
            Stop(Status.REJECTED, "admission refused on openai:gpt-5: cost above the TPM burst"),
            id="never-fits",
        ),
        pytest.param(
            given(attempts=0),
            Refusal(2.0),
            Wait(2.0 + ARRIVAL_SLACK_SECS, "waiting for capacity on openai:gpt-5", PRIMARY),
            id="a-wait-that-fits",
        ),
        pytest.param(
            given(attempts=0),
            Refusal(7200.0),
            Stop(Status.WAITING_FOR_CAPACITY, NO_CAPACITY, retry_in=7200.0),
            id="beyond-the-pause-limit",
        ),
        pytest.param(
            given(attempts=0, deadline=5.0),
            Refusal(5.0),
            Stop(Status.WAITING_FOR_CAPACITY, NO_CAPACITY, retry_in=5.0),
            id="beyond-the-deadline",
        ),
        pytest.param(
            given(PRIMARY, OTHER, attempts=0),
            Refusal(7200.0),
            FallBack(OTHER, 0.0, f"{NO_CAPACITY}; falling back to anthropic:claude at once", 1),
            id="falls-back-at-once",
        ),
    ],
)
def test_rule_8_admission_waits_falls_back_or_stops(
    state: LoopState, refusal: Refusal, expected: Decision
) -> None:
    record_refusal(state, 0.0)
    assert expected == decide_admission(state, refusal, Settings(), 0.0)


@pytest.mark.parametrize(
    ("state", "now", "expected"),
    [
        pytest.param(given(), 0.0, BOOK_HORIZON_SECS, id="the-horizon"),
        pytest.param(given(deadline=3.0), 1.0, 2.0, id="the-time-left"),
        pytest.param(given(deadline=3.0), 4.0, 0.0, id="nothing-left"),
    ],
)
@pytest.mark.parametrize("pause_limit", [3600.0, 60.0])
def test_rule_8_a_start_is_booked_within_the_time_left_and_the_horizon(
    state: LoopState, now: float, expected: float, pause_limit: float
) -> None:
    assert expected == book_within(state, Settings(pause_limit_secs=pause_limit), now)


# -- rule 9: a write whose effect is unknown ---------------------------------------------

NEEDS_CHECK = "unknown_outcome: the write may have taken effect and there is no outcome_check"
CANNOT_TELL = "unknown_outcome: outcome_check could not tell whether the write took effect"
TWICE = "unknown_outcome: the controlled retry failed ambiguously too"
APPLIED = "the write took effect (confirmed by outcome_check)"


def _retried() -> LoopState:
    state = given()
    use_controlled_retry(state)
    return state


@pytest.mark.parametrize(
    ("state", "verdict", "expected"),
    [
        pytest.param(given(), None, Stop(Status.NEEDS_OPERATOR, NEEDS_CHECK), id="no-check"),
        pytest.param(
            given(), WriteOutcome.UNKNOWN, Stop(Status.NEEDS_OPERATOR, CANNOT_TELL), id="unknown"
        ),
        pytest.param(
            given(), WriteOutcome.APPLIED, Stop(Status.COMPLETED, APPLIED), id="applied"
        ),
        pytest.param(
            moved(given(PRIMARY, OTHER)),
            WriteOutcome.APPLIED,
            Stop(Status.DEGRADED, APPLIED),
            id="applied-on-a-fallback",
        ),
        pytest.param(given(), WriteOutcome.NOT_APPLIED, None, id="one-controlled-retry"),
        pytest.param(
            _retried(), WriteOutcome.NOT_APPLIED, Stop(Status.NEEDS_OPERATOR, TWICE), id="twice"
        ),
    ],
)
def test_rule_9_writes_are_never_retried_blindly(
    state: LoopState, verdict: WriteOutcome | None, expected: Stop | None
) -> None:
    assert expected == decide_write(state, verdict)


# -- the transitions (rateloop.timing.state) ---------------------------------------------


def _fields(state: LoopState) -> tuple[object, ...]:
    return (
        state.index,
        state.route_attempts,
        state.waits,
        state.previous_wait,
        state.limited_route,
        state.limited_kind,
        sorted(state.spent_providers),
    )


@pytest.mark.parametrize(
    ("decision", "kind", "expected"),
    [
        pytest.param(
            Wait(7.0, "", PRIMARY), Kind.TEMPORARY, (0, 1, 1, 7.0, None, None, []), id="wait"
        ),
        pytest.param(
            FallBack(OTHER, 3.0, "", 1),
            Kind.OVERLOAD,
            (1, 0, 1, 3.0, PRIMARY, Kind.OVERLOAD, []),
            id="fallback",
        ),
        pytest.param(
            FallBack(OTHER, 0.0, "", 1),
            Kind.PERIOD_QUOTA,
            (1, 0, 1, 0.0, PRIMARY, Kind.PERIOD_QUOTA, ["openai"]),
            id="fallback-after-a-quota-excludes-the-provider",
        ),
        pytest.param(
            FallBack(OTHER, 0.0, "", 1),
            None,
            (1, 0, 0, None, PRIMARY, Kind.TEMPORARY, []),
            id="fallback-by-admission-is-no-retry",
        ),
    ],
)
def test_take_applies_a_decision(
    decision: Wait | FallBack, kind: Kind | None, expected: tuple[object, ...]
) -> None:
    state = given(PRIMARY, OTHER)
    take(state, decision, kind)
    assert expected == _fields(state)


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_start_attempt_spends_the_budget_and_the_routes_share(max_attempts: int) -> None:
    state = given(attempts=0, max_attempts=max_attempts)
    started = [start_attempt(state) for _ in range(max_attempts + 1)]
    assert [True] * max_attempts + [False] == started
    assert (max_attempts, max_attempts) == (state.budget.attempts, state.route_attempts)
