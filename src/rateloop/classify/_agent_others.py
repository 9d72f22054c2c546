"""The other agent CLIs and runners people put in recipes, read from lowercase text.

Cursor (``cursor-agent``), Kiro (``kiro-cli``), Amazon Q Developer (``q chat``),
Qwen Code, opencode, Ollama (its local queue and Ollama Cloud's plan limits) and
Hugging Face's inference credits.  Each reader returns a
:class:`~rateloop.classify._reading.Reading` or ``None``; the strings and their
sources are listed in ``docs/classify.md`` and held in
``tests/fixtures/classify/agents_others.yaml``.  A reset is read only where the
text prints one ("Your usage limits will reset when your monthly cycle ends on
11/17/2025", "The limits reset on 08/01"); "return next month" or "return
tomorrow" name no time, and none is invented.
"""

from __future__ import annotations

import re
from datetime import datetime, tzinfo

from rateloop.classify import _allowance as allowance
from rateloop.classify._phrases import find
from rateloop.classify._reading import Reader, Reading
from rateloop.classify._when import date_reset
from rateloop.signal import Dimension, Kind

__all__ = ["OTHER_AGENT_READERS"]

# --- Cursor ------------------------------------------------------------------

_CURSOR_MARKS = ("cursor pro", "cursor.com", "spendlimithit", "fallbackmodel")
_CURSOR_LIMIT = re.compile(r"hit your (?:usage|free requests) limit\b")


def _cursor(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_CURSOR_LIMIT, low) is None or not any(mark in low for mark in _CURSOR_MARKS):
        return None
    # "Your usage limits will reset when your monthly cycle ends on 11/17/2025."
    code = allowance.MONTHLY if "monthly cycle" in low else None
    return Reading(Kind.PERIOD_QUOTA, "hit your usage limit", "cursor",
                   reset_at=date_reset(low, now, tz), code=code)


# --- Kiro and Amazon Q Developer ----------------------------------------------

_KIRO_USAGE = re.compile(
    r"(?:reached your|the) (daily|monthly) usage limit(?: has been reached)?\b"
)
_Q_MONTHLY = re.compile(
    r"monthly (?:request )?limit reached\b|amazonqusagelimiterror\b"
    r"|generateassistantresponse reached for this month\b"
)


# The words alone could come from another tool: the provider is named only with a mark.
_KIRO_MARKS = ("kiro", "continue building", "request_id")
_Q_MARKS = ("amazonq", "amazon q", "q chat", "codewhisperer")


def _kiro_amazon_q(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_KIRO_USAGE, low)
    if found is not None:
        code = allowance.DAILY if found.group(1) == "daily" else allowance.MONTHLY
        provider = "kiro" if any(mark in low for mark in _KIRO_MARKS) else None
        return Reading(Kind.PERIOD_QUOTA, f"{found.group(1)} usage limit", provider,
                       reset_at=date_reset(low, now, tz), code=code)
    if find(_Q_MONTHLY, low) is not None:
        # A ThrottlingException by name, but the month's allowance: waiting minutes
        # will not help ("Maximum …GenerateAssistantResponse reached for this month.").
        provider = "amazon_q" if any(mark in low for mark in _Q_MARKS) else None
        return Reading(Kind.PERIOD_QUOTA, "monthly limit reached", provider,
                       reset_at=date_reset(low, now, tz), code=allowance.MONTHLY)
    return None


# --- Qwen Code -------------------------------------------------------------------

_QWEN_FREE = re.compile(r"free (?:tier|allocated) quota exceeded\b")


def _qwen(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    found = find(_QWEN_FREE, low)
    if found is None:
        return None
    # The free allowance is spent (its window is not printed); not a short throttle.
    # "Free allocated quota exceeded" is Qwen's (DashScope's) own wording.
    qwen = "qwen" in low or "allocated" in found.group(0)
    return Reading(Kind.PERIOD_QUOTA, "free quota exceeded", "qwen" if qwen else None)


# --- Ollama and Hugging Face -------------------------------------------------------

_OLLAMA_QUEUE = re.compile(r"maximum pending requests exceeded\b")
_OLLAMA_CLOUD = re.compile(r"reached your (session|hourly|weekly) usage limit\b")
_OLLAMA_CODES = {"session": allowance.SESSION, "hourly": allowance.HOURLY,
                 "weekly": allowance.WEEKLY}
_HF_CREDITS = re.compile(r"exceeded your monthly included credits\b")


def _runners(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if find(_OLLAMA_QUEUE, low) is not None:
        # A local server whose queue (OLLAMA_MAX_QUEUE) is full answers 503 "server
        # busy": it drains as requests finish, so a retry soon may pass.
        return Reading(Kind.OVERLOAD, "maximum pending requests exceeded", "ollama",
                       dimension=Dimension.CONCURRENCY)
    found = find(_OLLAMA_CLOUD, low)
    if found is not None:
        provider = "ollama" if "ollama" in low else None
        return Reading(Kind.PERIOD_QUOTA, f"{found.group(1)} usage limit", provider,
                       code=_OLLAMA_CODES[found.group(1)])
    if find(_HF_CREDITS, low) is not None:
        # Included credits return with the next month; buying credits is the other way.
        return Reading(Kind.PERIOD_QUOTA, "monthly included credits", "huggingface",
                       code=allowance.CREDITS)
    return None


#: Asked after Claude Code's and Copilot's own limits, before Codex's "hit your
#: usage limit" (Cursor prints the same words).
# --- opencode --------------------------------------------------------------------

# opencode relays its provider's plan limit (a ChatGPT plan through its Codex login, its own
# Zen / Go plans) as one line that names no window: a spent allowance, never a throttle.  The
# words are Codex's message; Codex's JSON error carries its reset and is read by Codex's reader.
_OPENCODE_LIMIT = re.compile(r"\bthe usage limit has been reached\b")


def _opencode(low: str, now: datetime, tz: tzinfo | None) -> Reading | None:
    if "usage_limit_reached" in low or find(_OPENCODE_LIMIT, low) is None:
        return None  # Codex's own JSON error (the same words): its reader knows the reset
    provider = "opencode" if "opencode" in low else None
    return Reading(Kind.PERIOD_QUOTA, "usage limit has been reached", provider,
                   reset_at=date_reset(low, now, tz))


OTHER_AGENT_READERS: tuple[Reader, ...] = (
    _cursor, _kiro_amazon_q, _qwen, _runners, _opencode,
)
