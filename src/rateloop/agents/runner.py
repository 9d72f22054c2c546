"""``run_step``: run one CLI agent step until it succeeds, or fails for a reason worth stopping.

How it works: this is the driver of :class:`~rateloop.agents.step.StepLoop`.
For each attempt it builds the argv (model, codex's output file), runs the
child with :func:`~rateloop.agents.process.run_attempt`, reads the attempt's
own result (its stdout file, or codex's final-message file), classifies the
output of a failed attempt with :func:`~rateloop.classify.classify_text`, and
carries out the decision: print the banner and wait on the injected clock,
or print the final message and return the :class:`~rateloop.outcome.Outcome`.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TextIO

from rateloop._clock import Clock, system_clock
from rateloop._redact import redact
from rateloop.agents.banner import (
    is_terminal,
    rate_limit_banner,
    reset_banner,
    wait_until,
    wait_visibly,
)
from rateloop.agents.command import (
    AUTO_MODEL,
    CODEX_OUTPUT_FLAG,
    Agent,
    infer_agent,
    step_label,
    with_codex_output,
    with_model,
    without_option,
)
from rateloop.agents.headless import agent_env, claude_auto_continue
from rateloop.agents.process import run_attempt
from rateloop.agents.reading import read_attempt
from rateloop.agents.settings import AgentSettings
from rateloop.agents.step import (
    AttemptPlan,
    AttemptReport,
    Finish,
    Retry,
    StepFailure,
    StepLoop,
    StepOutput,
    WaitForReset,
)
from rateloop.outcome.events import CapacityEvent, DecisionKind, EventSink, signal_fields
from rateloop.outcome.record import AttemptLedger, Outcome
from rateloop.route import Route
from rateloop.signal import LimitSignal

__all__ = ["CLASSIFY_TAIL_BYTES", "exit_code_for", "run_step"]

#: How much of the end of an attempt's stdout is classified (with the stderr tail).
CLASSIFY_TAIL_BYTES = 64 * 1024


def run_step(
    command: Sequence[str],
    *,
    agent: Agent | str | None = None,
    model: str | None = None,
    timeout: float | None = None,
    label: str | None = None,
    settings: AgentSettings | None = None,
    clock: Clock | None = None,
    stderr: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: bytes | None = None,
    kill_grace: float = 5.0,
    sinks: Sequence[EventSink] = (),
    wait_for_reset: float | None = None,
) -> Outcome:
    """Run ``command`` (an agent CLI step) with rate-limit-safe retries.

    Returns an :class:`~rateloop.outcome.Outcome`: on success ``value`` is
    the result, a :class:`~rateloop.agents.step.StepOutput` (the winning
    attempt's stdout; codex's final message): a ``str`` whose ``data`` holds
    the exact bytes; ``status`` is ``completed``, or ``degraded`` when it finished on the
    ``--model auto`` fallback.  On failure ``value`` is a
    :class:`~rateloop.agents.step.StepFailure` (its ``exit_code`` is what
    ``rateloop run`` exits with).  ``attempts.loop`` counts executions.

    ``settings`` default to the environment (:meth:`AgentSettings.from_env`
    over ``os.environ``); ``timeout`` bounds each attempt, in seconds;
    ``input`` is fed to every attempt's stdin (default: empty); banners,
    the child's stderr and the final error go to ``stderr`` (default:
    ``sys.stderr``): the child's bytes unchanged into its binary ``buffer``
    when it has one, decoded (invalid bytes replaced) into a text-only
    stream such as :class:`io.StringIO`.  Waits go through ``clock`` (default: the system clock).
    Each decision after a rate limit (wait, retry, fallback, stop, success
    after a retry) is a :class:`~rateloop.outcome.events.CapacityEvent`, sent to
    ``sinks`` and kept in ``Outcome.events``; events name the step by its
    label and never carry the command's arguments (the prompt).

    ``wait_for_reset`` (seconds, None: off) lets a usage limit whose reset
    time is known and at most that far away be waited out on ``clock`` (with
    a countdown on a terminal); the step then runs once more.  Without it a
    usage limit ends the step at once (``waiting_for_reset``, exit 75).
    """
    command = list(command)
    if not command or not command[0]:
        raise ValueError("run_step needs a command to run, got an empty command")
    if timeout is not None and not (timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0, or None; got {timeout!r}")
    if wait_for_reset is not None and not (0 < wait_for_reset < math.inf):
        raise ValueError(
            f"wait_for_reset must be a number of seconds > 0, or None; got {wait_for_reset!r}"
        )
    agent = _agent(agent) if agent is not None else infer_agent(command)
    settings = settings if settings is not None else AgentSettings.from_env(os.environ)
    clock = clock if clock is not None else system_clock
    stream = stderr if stderr is not None else sys.stderr
    loop = StepLoop(
        settings=settings,
        agent=agent,
        label=label or step_label(command),
        model=model,
        wait_for_reset=wait_for_reset,
        agent_auto_resume=agent is Agent.CLAUDE and claude_auto_continue(env, cwd),
    )
    env = agent_env(agent, env)
    user_codex_path: str | None = None
    if agent is Agent.CODEX:
        args, user_codex_path = without_option(command[1:], CODEX_OUTPUT_FLAG)
        command = [command[0], *args]
    ledger = AttemptLedger()
    events = _Events(loop, ledger, tuple(sinks))
    with _scratch_dir(agent) as scratch:
        number = 1
        while True:
            plan = loop.plan(number)
            if number > 1:
                events.emit(
                    DecisionKind.FALLBACK if plan.fallback else DecisionKind.RETRY,
                    plan,
                    reason=f"attempt {number} of {plan.total}",
                )
            codex_path = None if scratch is None else str(scratch / f"last-message-{number}.txt")
            ledger.record_loop()
            report, output = _attempt(
                _attempt_argv(command, plan, codex_path),
                codex_path=codex_path,
                timeout=timeout,
                settings=settings,
                stream=stream,
                env=env,
                cwd=cwd,
                input=input,
                kill_grace=kill_grace,
            )
            report, signal = read_attempt(
                report, output, now=clock.now(), codex=agent is Agent.CODEX
            )
            decision = loop.decide(plan, report, signal, now=clock.now())
            if isinstance(decision, Retry):
                events.emit(DecisionKind.WAIT, plan, signal=signal, wait=decision.wait)
                _say(
                    stream,
                    rate_limit_banner(
                        signal=decision.signal.matched or decision.signal.kind.value,
                        wait=decision.wait,
                        retry=decision.retry,
                        max_retries=settings.max_retries,
                        attempt=plan.number + 1,
                        total=loop.plan(plan.number + 1).total,
                        kind=decision.signal.kind,
                        allowance=report.allowance,
                    ),
                )
                wait_visibly(clock, decision.wait, stream)
                number += 1
                continue
            if isinstance(decision, WaitForReset):
                events.emit(
                    DecisionKind.WAIT,
                    plan,
                    signal=signal,
                    wait=decision.wait,
                    reason="waiting for the usage limit to reset at "
                    + decision.reset_at.isoformat(timespec="seconds"),
                )
                _say(
                    stream,
                    reset_banner(
                        label=loop.label,
                        signal=decision.signal.matched or decision.signal.kind.value,
                        reset_at=decision.reset_at,
                        now=clock.now(),
                        limit=decision.limit,
                        allowance=decision.allowance,
                        note=decision.note,
                    ),
                )
                wait_until(clock, decision.until, stream)
                number += 1
                continue
            if user_codex_path and isinstance(decision.value, StepOutput):
                Path(user_codex_path).write_bytes(decision.value.data)
            if number > 1 or not decision.status.succeeded:
                events.emit(
                    DecisionKind.SUCCESS_AFTER_RETRY
                    if decision.status.succeeded
                    else DecisionKind.STOP,
                    plan,
                    signal=signal,
                    status=decision.status.value,
                    reason=decision.reason,
                )
            return _finish(decision, loop, plan, ledger, stream, events.recorded)


def exit_code_for(outcome: Outcome) -> int:
    """The exit code ``rateloop run`` uses for ``outcome``: 0, the child's code, 65, 75 or 124."""
    if outcome.ok:
        return 0
    if isinstance(outcome.value, StepFailure):
        return outcome.value.exit_code
    return 1


# -- one attempt -------------------------------------------------------------------------------


def _agent(value: Agent | str) -> Agent:
    try:
        return Agent(value)
    except ValueError:
        allowed = ", ".join(a.value for a in Agent)
        raise ValueError(f"unknown agent {value!r} (allowed: {allowed})") from None


@contextlib.contextmanager
def _scratch_dir(agent: Agent) -> Iterator[Path | None]:
    """A private directory for codex's per-attempt final-message files (None for others)."""
    if agent is not Agent.CODEX:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="rateloop-codex-") as name:
        yield Path(name)


def _attempt_argv(command: Sequence[str], plan: AttemptPlan, codex_path: str | None) -> list[str]:
    args = list(command[1:])
    if plan.model is not None:
        args = with_model(args, plan.model)
    if codex_path is not None:
        args = with_codex_output(args, codex_path)
    return [command[0], *args]


def _attempt(
    argv: Sequence[str],
    *,
    codex_path: str | None,
    timeout: float | None,
    settings: AgentSettings,
    stream: TextIO,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    input: bytes | None,
    kill_grace: float,
) -> tuple[AttemptReport, str]:
    """Run one attempt; its report and the output text to classify if it failed."""
    limit = settings.max_step_output_bytes
    with tempfile.TemporaryFile(prefix="rateloop-stdout-") as out, _stdin(input) as stdin:
        proc = run_attempt(
            argv,
            stdout=out,
            stderr=stream,
            timeout=timeout,
            stdin=stdin,
            env=env,
            cwd=cwd,
            kill_grace=kill_grace,
        )
        stdout_tail = _tail(out, CLASSIFY_TAIL_BYTES)
        result: StepOutput | None = None
        error: str | None = None
        if proc.returncode == 0 and not proc.timed_out:
            if codex_path is not None:
                result, error = _read_codex_message(Path(codex_path), limit)
            else:
                result, error = _read_stdout(out, limit)
    stdout_text = stdout_tail.decode("utf-8", "replace")
    stderr_text = proc.stderr_tail.decode("utf-8", "replace")
    report = AttemptReport(
        exit_code=proc.returncode,
        timed_out=proc.timed_out,
        timeout=timeout,
        result=result,
        result_error=error,
        start_error=proc.start_error,
        stdout_tail=stdout_text,
        stderr_tail=stderr_text,
    )
    return report, stdout_text + "\n" + stderr_text


@contextlib.contextmanager
def _stdin(data: bytes | None) -> Iterator[IO[bytes] | None]:
    if data is None:
        yield None
        return
    with tempfile.TemporaryFile(prefix="rateloop-stdin-") as f:
        f.write(data)
        f.seek(0)
        yield f


def _size(f: IO[bytes]) -> int:
    return os.fstat(f.fileno()).st_size


def _tail(f: IO[bytes], n: int) -> bytes:
    f.seek(max(0, _size(f) - n))
    return f.read(n)


def _too_big(what: str, size: int, limit: int) -> str:
    return (
        f"{what} is {size} bytes, over the limit of {limit} bytes"
        " (raise RATELOOP_MAX_STEP_OUTPUT_BYTES to accept it)"
    )


def _read_stdout(f: IO[bytes], limit: int) -> tuple[StepOutput | None, str | None]:
    size = _size(f)
    if size > limit:
        return None, _too_big("its stdout", size, limit)
    f.seek(0)
    return StepOutput(f.read()), None


def _read_codex_message(path: Path, limit: int) -> tuple[StepOutput | None, str | None]:
    """Codex's final message: a non-empty UTF-8 file within ``limit`` bytes."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None, f"codex wrote no final message ({CODEX_OUTPUT_FLAG} {path} was not created)"
    if size > limit:
        return None, _too_big("codex's final message", size, limit)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"codex's final message is not valid UTF-8 (byte {exc.start})"
    if not text.strip():
        return None, "codex's final message is empty"
    return StepOutput(data), None


# -- the end -----------------------------------------------------------------------------------


def _say(stream: TextIO, text: str) -> None:
    """Print one of our own messages (never the child's stream), secrets redacted."""
    try:
        stream.write(redact(text) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # our stderr is gone; the Outcome still says everything


def _colors(stream: TextIO) -> bool:
    """Dim text only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return is_terminal(stream) and not os.environ.get("NO_COLOR")


def _route(agent: Agent, model: str | None) -> Route | None:
    # A model name Route cannot hold (e.g. with ':') just leaves the outcome without a route.
    try:
        return Route(provider=agent.value, model=model or "default")
    except ValueError:
        return None


class _Events:
    """The capacity events of one step: built from the plan and signal, sent to every sink."""

    __slots__ = ("ledger", "loop", "recorded", "sinks")

    def __init__(self, loop: StepLoop, ledger: AttemptLedger, sinks: tuple[EventSink, ...]):
        self.loop = loop
        self.ledger = ledger
        self.sinks = sinks
        self.recorded: list[CapacityEvent] = []

    def emit(
        self,
        decision: DecisionKind,
        plan: AttemptPlan,
        *,
        signal: LimitSignal | None = None,
        wait: float | None = None,
        status: str | None = None,
        reason: str | None = None,
    ) -> None:
        route = _route(self.loop.agent, plan.model)
        event = CapacityEvent(
            decision=decision,
            operation=self.loop.label,
            provider=self.loop.agent.value,
            model=plan.model,
            scope=route.scope if route is not None else None,
            **signal_fields(signal),
            attempt=self.ledger.loop,
            wait_seconds=wait,
            status=status,
            reason=reason,
        )
        self.recorded.append(event)
        for sink in self.sinks:
            sink(event)


def _finish(
    decision: Finish,
    loop: StepLoop,
    plan: AttemptPlan,
    ledger: AttemptLedger,
    stream: TextIO,
    events: Sequence[CapacityEvent],
) -> Outcome:
    if decision.note:
        _say(stream, decision.note)
    if isinstance(decision.value, StepFailure):
        if decision.value.excerpt is not None:
            _say(stream, decision.value.excerpt.render(loop.label, color=_colors(stream)))
        _say(stream, decision.value.message)
    return Outcome(
        status=decision.status,
        reason=decision.reason,
        value=decision.value,
        attempts=ledger.snapshot(),
        route=_route(loop.agent, plan.model),
        limited_route=_route(loop.agent, loop.model) if plan.model == AUTO_MODEL else None,
        retry_at=decision.retry_at,
        signal=decision.signal,
        events=tuple(events),
    )
