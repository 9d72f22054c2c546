"""What one attempt of a CLI agent said: its own result first, then its text.

How it works: a headless agent's machine-readable result (Claude Code's
``--output-format json`` / ``stream-json``, ``codex exec --json``,
``gemini -o json``) is read with :mod:`rateloop.classify.agent_results`;
it decides whether an exit 0 was a success, and its refusal texts (not the
JSON around them) are classified.  Output that holds no such result is read
as text with :func:`~rateloop.classify.classify_text`, as before.  Either
way the report is completed with what the agent said about itself: the
allowance that ran out, the retries it made by itself, whether it will
continue by itself.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from rateloop.agents.step import AttemptReport
from rateloop.classify import classify_text
from rateloop.classify.agent_results import (
    AgentResult,
    agent_retries_of,
    allowance_of,
    auto_resume_of,
    classify_agent_result,
    read_agent_result,
)
from rateloop.signal import Kind, LimitSignal

__all__ = ["read_attempt"]

#: The kinds whose allowance is worth naming: a limit on the account, not a failure.
_LIMIT_KINDS = frozenset({Kind.TEMPORARY, Kind.PERIOD_QUOTA, Kind.SPEND})


def _result_of(report: AttemptReport, *, codex: bool) -> AgentResult | None:
    """The agent's own machine-readable result, when its stdout holds one."""
    stdout = report.stdout_tail
    if report.exit_code == 0 and not codex and report.result is not None:
        stdout = report.result  # all of it: one JSON document may be longer than the tail
    return read_agent_result(stdout, report.stderr_tail)


def read_attempt(
    report: AttemptReport, output: str, *, now: datetime, codex: bool = False
) -> tuple[AttemptReport, LimitSignal | None]:
    """What the attempt said: its own result first, then its text; the report completed.

    A timeout or a failed start is not read.  An exit 0 is a success unless
    the agent's own result says it failed (headless agents report a limit
    inside a result and still exit 0).
    """
    if report.timed_out or report.start_error is not None:
        return report, None
    result = _result_of(report, codex=codex)
    failed = result is not None and result.failed
    if report.exit_code == 0 and not failed:
        return report, None
    signal = None
    if result is not None and failed:
        signal = classify_agent_result(result, now=now)
    if signal is None or (signal.kind is Kind.UNKNOWN and report.exit_code != 0):
        signal = classify_text(output, exit_code=report.exit_code or 1, now=now)
    allowance = None
    if signal.kind in _LIMIT_KINDS:
        allowance = allowance_of(signal, result.limit_type if result is not None else None)
    report = replace(
        report,
        agent_failed=failed,
        refusal=result.texts if result is not None and failed else (),
        allowance=allowance,
        agent_retries=max(
            result.agent_retries if result is not None else 0, agent_retries_of(output)
        ),
        auto_resume=(result is not None and result.auto_resume) or auto_resume_of(output),
    )
    return report, signal
