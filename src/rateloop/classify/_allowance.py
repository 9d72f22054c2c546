"""Which allowance an agent said ran out: the ``code`` of a signal read from agent text.

Subscription agents (Claude Code, Codex, Copilot, Gemini CLI, Cursor, Kiro,
Amazon Q, Ollama Cloud …) refuse with their own plan limits, not a provider's
error code.  When the text names the allowance, the signal's ``code`` says
which, from this closed vocabulary; when it does not ("You've hit your
limit"), ``code`` stays ``None``.  A window is never guessed from a model or
a plan: only the words printed decide.

============================ ==================================================
code                         the agent said
============================ ==================================================
``session_limit``            a rolling session window (Claude Code's session /
                             5-hour limit, Copilot's "5 hour session limits",
                             Ollama Cloud's session usage limit)
``hourly_limit``             an hourly allowance (Ollama Cloud)
``daily_limit``              a daily allowance (Kiro, Gemini CLI)
``weekly_limit``             a weekly allowance (Claude Code, Copilot
                             ``user_weekly_rate_limited``, Ollama Cloud)
``monthly_limit``            a monthly allowance (Copilot chat messages, Kiro,
                             Amazon Q, Cursor's monthly cycle)
``model_limit``              a limit on one model or model family, window not
                             stated ("Usage limit reached for all Pro models",
                             "You've hit your Opus limit")
``model_daily_limit``        one model's daily allowance ("your daily
                             gemini-2.5-pro quota limit")
``model_weekly_limit``       one model's weekly allowance ("Opus weekly limit")
``spend_limit``              a spend cap set on the account ("monthly spend
                             limit", "extra usage spend limit")
``credits``                  prepaid or included credits are used up ("out of
                             extra usage", "monthly included credits")
============================ ==================================================
"""

from __future__ import annotations

__all__ = [
    "ALLOWANCES",
    "CREDITS",
    "DAILY",
    "HOURLY",
    "MODEL",
    "MODEL_DAILY",
    "MODEL_WEEKLY",
    "MONTHLY",
    "SESSION",
    "SPEND_LIMIT",
    "WEEKLY",
    "allowance_words",
]

SESSION = "session_limit"
HOURLY = "hourly_limit"
DAILY = "daily_limit"
WEEKLY = "weekly_limit"
MONTHLY = "monthly_limit"
MODEL = "model_limit"
MODEL_DAILY = "model_daily_limit"
MODEL_WEEKLY = "model_weekly_limit"
SPEND_LIMIT = "spend_limit"
CREDITS = "credits"

#: Every ``code`` an agent-text signal may carry, with the words that explain it.
ALLOWANCES: dict[str, str] = {
    SESSION: "the session limit",
    HOURLY: "the hourly limit",
    DAILY: "the daily limit",
    WEEKLY: "the weekly limit",
    MONTHLY: "the monthly limit",
    MODEL: "a limit on this model",
    MODEL_DAILY: "this model's daily limit",
    MODEL_WEEKLY: "this model's weekly limit",
    SPEND_LIMIT: "the account's spend limit",
    CREDITS: "the credit balance",
}


def allowance_words(code: str | None) -> str | None:
    """The words for an allowance ``code`` ("the weekly limit"), or ``None``."""
    if code is None:
        return None
    return ALLOWANCES.get(code)
