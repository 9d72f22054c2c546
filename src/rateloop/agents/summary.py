"""``rateloop run --json``: the end of a step as one JSON object a script can read.

It says what the step's own messages say, as data: the status and exit
code, the kind of refusal read last, which allowance ran out and when it
returns — only as the agent or provider stated them, never an invented
reset — who resumes a usage-limited step, and the retries the agent made by
itself.  It never carries the command's arguments (the prompt) or output.
"""

from __future__ import annotations

from typing import Any

from rateloop.agents.runner import exit_code_for
from rateloop.agents.step import StepFailure
from rateloop.outcome.record import Outcome

__all__ = ["step_summary"]


def step_summary(outcome: Outcome) -> dict[str, Any]:
    """The JSON-ready summary of a step's ``outcome``."""
    failure = outcome.value if isinstance(outcome.value, StepFailure) else None
    signal = outcome.signal
    reset_at = signal.reset_at if signal is not None else None
    return {
        "status": outcome.status.value,
        "exit_code": exit_code_for(outcome),
        "reason": outcome.reason,
        "attempts": outcome.attempts.loop,
        "kind": signal.kind.value if signal is not None else None,
        "signal": signal.matched if signal is not None else None,
        "allowance": failure.allowance if failure is not None else None,
        "reset_at": reset_at.isoformat(timespec="seconds") if reset_at is not None else None,
        "resumed_by": failure.resumed_by if failure is not None else None,
        "agent_retries": failure.agent_retries if failure is not None else 0,
    }
