"""The sans-IO core of ``rateloop run``: what each attempt runs, and what to do after it.

How it works: :class:`StepLoop` is built once per step from the resolved
settings.  Before attempt ``n`` the driver asks :meth:`StepLoop.plan` which
model the attempt runs on (the caller's model, or ``auto`` on a final
fallback retry).  After the attempt the driver reports what happened as an
:class:`AttemptReport` (exit code, timeout, the result or why it is
unusable) together with the :class:`~rateloop.signal.LimitSignal` classified
from the output, and :meth:`StepLoop.decide` answers with a value:

- :class:`Retry` — print the banner, wait ``wait`` seconds, run attempt ``n + 1``;
- :class:`WaitForReset` — (``--wait-for-reset`` only) wait until a usage
  limit's reset time, then run attempt ``n + 1``;
- :class:`Finish` — the step is over: a :class:`~rateloop.outcome.Status`,
  the exit code for the command line and, for failures, the message to print.

The rules, in order: a timeout ends the step (exit 124, never retried);
exit 0 succeeds (``degraded`` when it ran on the ``auto`` fallback) unless
the agent's own result says it failed (then it is read like a failed
attempt) or the result is unusable (exit 65); a period quota ends the step
without a short retry (exit 75, ``waiting_for_reset``) — unless the agent
said it continues by itself (then nobody else resumes it), or
``wait_for_reset`` is set, the reset time is known and within it, and the
step has not waited for a reset yet: then it waits for the reset (plus
:data:`RESET_MARGIN_SECS`) and runs once more, an extra execution that spends
no retry; a rate-limit signal
(:data:`RETRIED_KINDS`) is retried after ``min(base·2^(n−1), max)`` seconds
until ``1 + max_retries`` requests are spent — executions plus the retries
the agent made by itself — (then exit 75); every other
failure ends the step at once with the child's exit code.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from rateloop.agents.banner import (
    exhausted_message,
    format_seconds,
    human_duration,
    period_quota_message,
)
from rateloop.agents.command import AUTO_MODEL, Agent
from rateloop.agents.excerpt import OutputExcerpt, excerpt_of
from rateloop.agents.settings import AgentSettings
from rateloop.outcome.record import Status
from rateloop.signal import Kind, LimitSignal
from rateloop.timing.backoff import Backoff

__all__ = [
    "EXIT_TEMPFAIL",
    "EXIT_TIMEOUT",
    "EXIT_UNUSABLE_RESULT",
    "RETRIED_KINDS",
    "AttemptPlan",
    "AttemptReport",
    "Finish",
    "Retry",
    "StepFailure",
    "StepLoop",
    "StepOutput",
    "WaitForReset",
]

#: sysexits EX_TEMPFAIL: try again later (rate limit outlasted the retries, or a period quota).
EXIT_TEMPFAIL = 75
#: timeout(1)'s convention: the attempt ran out of time and was killed.
EXIT_TIMEOUT = 124
#: sysexits EX_DATAERR: the agent exited 0 but its result cannot be used.
EXIT_UNUSABLE_RESULT = 65

#: Added to a usage limit's reset time before running again: reset times are often given
#: to the minute ("resets 3:30am"), and the machine's clock may be behind the provider's.
RESET_MARGIN_SECS = 60.0

#: Signals a short retry can outlast: provider throttling and overload.
RETRIED_KINDS: frozenset[Kind] = frozenset({Kind.TEMPORARY, Kind.OVERLOAD})


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptPlan:
    """What attempt ``number`` (from 1) of ``total`` runs on.

    ``model`` is the model to pass as ``--model`` (None: leave the command's
    own arguments alone).  ``fallback`` is True when it is the ``auto`` model
    standing in for the requested one.
    """

    number: int
    total: int
    model: str | None
    fallback: bool = False


class StepOutput(str):
    """The result of a successful step: text, with the agent's exact bytes in :attr:`data`.

    It is a ``str`` — the output decoded as UTF-8, an invalid byte shown as
    U+FFFD, as before — so code that treats the result as text keeps
    working (and a task store can keep it as text).  :attr:`data` is what the
    agent wrote, byte for byte; ``rateloop run`` prints that.  Like any
    ``str``, it compares by its text.
    """

    # A str subclass cannot have __slots__ with fields; the bytes live in the instance dict.
    _data: bytes

    def __new__(cls, data: bytes) -> StepOutput:
        self = super().__new__(cls, data.decode("utf-8", "replace"))
        self._data = bytes(data)
        return self

    @property
    def data(self) -> bytes:
        """The output exactly as the agent wrote it."""
        return self._data

    def __reduce__(self) -> tuple[type[StepOutput], tuple[bytes]]:
        # Pickle and copy rebuild from the bytes (str's own reduce would pass the text).
        return (StepOutput, (self._data,))


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptReport:
    """What the driver saw when one attempt ended.

    ``exit_code`` is the child's return code (negative: killed by that
    signal).  ``result`` is the attempt's result (the runner passes a
    :class:`StepOutput`) when it exited 0 and the result was usable;
    ``result_error`` says why it was not.
    ``start_error`` is set when the command could not be started at all.
    ``stdout_tail`` and ``stderr_tail`` are the ends of the attempt's own
    output (decoded), shown when the step fails.

    What the agent said in its own result or output: ``agent_failed`` (its
    machine-readable result says it failed, whatever its exit code),
    ``refusal`` (the lines that carry the refusal, from whichever stream),
    ``allowance`` (which allowance ran out, as it named it),
    ``agent_retries`` (the retries it made by itself before it gave up) and
    ``auto_resume`` (it said it continues by itself at the reset).
    """

    exit_code: int
    timed_out: bool = False
    timeout: float | None = None
    result: str | None = None
    result_error: str | None = None
    start_error: str | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    agent_failed: bool = False
    refusal: tuple[str, ...] = ()
    allowance: str | None = None
    agent_retries: int = 0
    auto_resume: bool = False

    @property
    def succeeded(self) -> bool:
        """Exit 0 and no failure in the agent's own result."""
        return self.exit_code == 0 and not self.agent_failed


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """Wait ``wait`` seconds, then run attempt ``retry + 1``."""

    wait: float
    retry: int
    signal: LimitSignal


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitForReset:
    """Wait until ``until`` (the reset time plus a margin, about ``wait`` seconds), then run again.

    ``limit`` is the ``--wait-for-reset`` bound the wait fell within;
    ``allowance`` the allowance that ran out, as the agent named it;
    ``note`` says why rateloop run, not the agent, resumes the step when the
    agent's own auto-continue setting is on.
    """

    until: datetime
    wait: float
    reset_at: datetime
    limit: float
    signal: LimitSignal
    allowance: str | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFailure:
    """How a failed step ended; the ``value`` of a step :class:`~rateloop.outcome.Outcome`.

    ``exit_code`` is what ``rateloop run`` exits with; ``child_exit_code`` is
    the last attempt's own return code (None when it was killed on timeout
    or never started).  ``message`` is the error printed on stderr.
    ``excerpt`` is the end of the failed attempt's own output (cleaned and
    redacted), printed under a dim header before the message; None when the
    attempt printed nothing, timed out or never started.  ``allowance`` is
    which allowance ran out, as a code (``session_limit``, ``weekly_limit``,
    ``spend_limit``, ``credits``, ...: the ``code`` of agent text, or the
    agent's ``rateLimitType``), None when the agent did not name it;
    ``agent_retries`` the retries the agents made by themselves over the
    step; ``resumed_by`` who resumes a usage-limited step (``agent``: it said
    it continues by itself; ``rateloop run``; None: nobody in this run).
    """

    exit_code: int
    message: str
    child_exit_code: int | None = None
    timed_out: bool = False
    excerpt: OutputExcerpt | None = None
    allowance: str | None = None
    agent_retries: int = 0
    resumed_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish:
    """The step is over.  ``value`` is the result on success, else a :class:`StepFailure`."""

    status: Status
    reason: str
    exit_code: int
    value: str | StepFailure | None
    signal: LimitSignal | None = None
    retry_at: datetime | None = None
    note: str | None = None


def _signal_text(signal: LimitSignal) -> str:
    return signal.matched or signal.code or signal.kind.value


class StepLoop:
    """The retry rules of one CLI agent step: a state machine without I/O (see the module doc).

    Its state: whether the step has waited for a usage limit's reset yet, and
    how many retries the agent made by itself (they spend the step's budget:
    ``1 + max_retries`` requests, whichever layer makes them).
    ``agent_auto_resume`` is whether the agent's own setting makes it continue
    by itself at a usage limit (Claude Code's ``autoContinueAtUsageLimit``).
    """

    __slots__ = (
        "_agent_retries", "_backoff", "_resumed_at", "agent", "agent_auto_resume", "label",
        "model", "settings", "wait_for_reset",
    )

    def __init__(
        self,
        *,
        settings: AgentSettings,
        agent: Agent,
        label: str,
        model: str | None = None,
        wait_for_reset: float | None = None,
        agent_auto_resume: bool = False,
    ) -> None:
        self.settings = settings
        self.agent_auto_resume = agent_auto_resume
        self._agent_retries = 0
        self.agent = agent
        self.label = label
        self.model = model
        self.wait_for_reset = wait_for_reset
        # The number of the attempt that runs after the reset wait (None: no wait yet).
        self._resumed_at: int | None = None
        self._backoff = Backoff(
            strategy="exponential",
            initial=settings.base_delay_secs,
            max_delay=settings.max_delay_secs,
            multiplier=2.0,
            jitter="none",
        )

    def wait_before(self, retry: int) -> float:
        """The wait before retry ``retry`` (from 1): ``min(base·2^(retry−1), max)``."""
        return self._backoff.base(retry)

    def plan(self, number: int) -> AttemptPlan:
        """The model attempt ``number`` runs on.

        The ``auto`` fallback replaces the model only on the last execution,
        only when that execution is a retry (a step allowed a single run keeps
        the model it asked for), and only for agents that accept ``auto``.
        The run after a usage limit's reset is an extra execution, and keeps
        the requested model.
        """
        total = self._total(number)
        fallback = (
            self.settings.fallback_auto_model
            and self.agent.accepts_auto_model
            and number == total
            and number > 1
            and number != self._resumed_at
        )
        model = AUTO_MODEL if fallback else self.model
        return AttemptPlan(number=number, total=total, model=model, fallback=fallback)

    def _total(self, number: int) -> int:
        """The executions this step may make: its budget less the agent's own retries."""
        budget = self.settings.max_executions + (self._resumed_at is not None)
        return max(number, budget - self._agent_retries)

    def decide(
        self, plan: AttemptPlan, report: AttemptReport, signal: LimitSignal | None, *, now: datetime
    ) -> Retry | WaitForReset | Finish:
        """What to do after attempt ``plan.number`` ended as ``report`` (see the module doc)."""
        label = self.label
        self._agent_retries += max(0, report.agent_retries)
        if report.start_error is not None:
            message = f"Error: {label} could not be started: {report.start_error}"
            return self._fail(Status.NEEDS_OPERATOR, report.exit_code, message, report)
        if report.timed_out:
            limit = format_seconds(report.timeout) if report.timeout is not None else "?"
            message = (
                f"Error: {label} timed out after {limit}s on attempt {plan.number} of"
                f" {plan.total}; its process group was killed. A timeout is not retried."
            )
            return self._fail(Status.NEEDS_OPERATOR, EXIT_TIMEOUT, message, report)
        if report.succeeded:
            if report.result_error is not None:
                message = (
                    f"Error: {label} exited 0 but its result is unusable: {report.result_error}"
                )
                return self._fail(Status.INVALID, EXIT_UNUSABLE_RESULT, message, report)
            if plan.fallback:
                note = (
                    f"Note: {label} finished on --model {AUTO_MODEL} after the requested model"
                    " stayed rate limited."
                )
                return Finish(
                    status=Status.DEGRADED,
                    reason=f"completed on --model {AUTO_MODEL} (fallback)",
                    exit_code=0,
                    value=report.result,
                    note=note,
                )
            return Finish(
                status=Status.COMPLETED, reason="completed", exit_code=0, value=report.result
            )
        if signal is not None and signal.kind is Kind.PERIOD_QUOTA:
            resumed_by: str | None = None
            if report.auto_resume:
                # The agent said it continues by itself: running it again would do the work twice.
                wait: WaitForReset | str = (
                    f"{label} said it will continue by itself when the limit resets;"
                    " rateloop run will not run it again."
                )
                resumed_by = "agent"
            else:
                wait = self._reset_wait(plan, signal, now, report.allowance)
                if isinstance(wait, WaitForReset):
                    return wait
            message = period_quota_message(
                label, signal=_signal_text(signal), reset_at=signal.reset_at, now=now,
                allowance=report.allowance,
            )
            if isinstance(wait, str) and wait:
                message += "\n" + wait
            return self._fail(
                Status.WAITING_FOR_RESET, EXIT_TEMPFAIL, message, report, signal=signal,
                resumed_by=resumed_by,
            )
        if signal is not None and signal.kind in RETRIED_KINDS:
            total = self._total(plan.number)
            if plan.number >= total:
                # The run after a reset wait is an extra execution, not a retry.
                extra = int(self._resumed_at is not None and plan.number >= self._resumed_at)
                message = exhausted_message(
                    label, plan.number - 1 - extra, attempts=plan.number, kind=signal.kind,
                    agent_retries=self._agent_retries,
                )
                return self._fail(
                    Status.FAILED_RETRY_EXHAUSTED, EXIT_TEMPFAIL, message, report, signal=signal
                )
            # The run after a reset wait spent no retry.
            resumed = self._resumed_at is not None and plan.number >= self._resumed_at
            retry = plan.number - int(resumed)
            return Retry(wait=self.wait_before(retry), retry=retry, signal=signal)
        code = _shell_exit_code(report.exit_code)
        message = f"Error: {label} failed (exit {code})"
        if report.exit_code == 0:
            # Exit 0, but the agent's own result says it failed: never a success, never exit 0.
            code = 1
            message = f"Error: {label} exited 0 but its own result reports an error"
        if report.exit_code < 0:
            message += f", killed by signal {-report.exit_code}"
        status = (
            Status.INVALID
            if signal is not None and signal.kind is Kind.INVALID
            else Status.NEEDS_OPERATOR
        )
        return self._fail(status, code, message, report, signal=signal)

    def _reset_wait(
        self, plan: AttemptPlan, signal: LimitSignal, now: datetime, allowance: str | None = None
    ) -> WaitForReset | str:
        """Wait for this usage limit's reset, or why not ("" when not asked to wait)."""
        limit = self.wait_for_reset
        if limit is None:
            return ""
        reset_at = signal.reset_at
        if self._resumed_at is not None:
            return "Still limited after waiting for the reset once; not waiting again."
        if reset_at is None:
            return "--wait-for-reset cannot wait: the provider did not say when the limit resets."
        left = (reset_at - now).total_seconds()
        if left > limit:
            return (
                f"That is beyond --wait-for-reset's {human_duration(limit)}; not waiting."
            )
        self._resumed_at = plan.number + 1
        wait = max(0.0, left) + RESET_MARGIN_SECS
        return WaitForReset(
            until=max(reset_at, now) + timedelta(seconds=RESET_MARGIN_SECS),
            wait=wait,
            reset_at=reset_at,
            limit=limit,
            signal=signal,
            allowance=allowance,
            note=(
                f"{self.label}'s own auto-continue is on, but it exited, so it cannot resume;"
                " rateloop run resumes this step."
                if self.agent_auto_resume
                else None
            ),
        )

    def _fail(
        self,
        status: Status,
        exit_code: int,
        message: str,
        report: AttemptReport,
        *,
        signal: LimitSignal | None = None,
        resumed_by: str | None = None,
    ) -> Finish:
        child = None if report.timed_out or report.start_error is not None else report.exit_code
        excerpt = None
        if child is not None and not report.succeeded:
            excerpt = excerpt_of(
                stderr=report.stderr_tail,
                stdout=report.stdout_tail,
                refusal=report.refusal,
                needle=signal.matched if signal is not None else None,
            )
        failure = StepFailure(
            exit_code=exit_code,
            message=message,
            child_exit_code=child,
            timed_out=report.timed_out,
            excerpt=excerpt,
            allowance=report.allowance,
            agent_retries=self._agent_retries,
            resumed_by=resumed_by,
        )
        first_line = message.splitlines()[0].removeprefix("Error: ")
        return Finish(
            status=status,
            reason=first_line,
            exit_code=exit_code,
            value=failure,
            signal=signal,
            retry_at=signal.reset_at if signal is not None else None,
        )

    def __repr__(self) -> str:
        wait = "" if self.wait_for_reset is None else f", wait_for_reset={self.wait_for_reset:g}"
        return (
            f"StepLoop(agent={self.agent.value}, label={self.label!r}, model={self.model!r}, "
            f"{self.settings!r}{wait})"
        )


def _shell_exit_code(returncode: int) -> int:
    """A child killed by signal N exits ``128 + N``, as a shell would report it."""
    return 128 - returncode if returncode < 0 else returncode
