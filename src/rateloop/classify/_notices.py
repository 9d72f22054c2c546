"""Notices that are not refusals: model fallbacks and usage warnings, masked before reading.

An agent that switches models and goes on ("Slow response times detected.
Automatically switching from gemini-2.5-pro to gemini-2.5-flash for faster
responses for the remainder of this session.", "Claude Opus 4 limit reached, now
using Sonnet 4") or warns ahead of a limit ("Approaching Opus usage limit",
"You've used 51% of your weekly rate limit") has not been refused: the step went
on.  These lines are masked out of the text, so what else the output says
decides; when nothing else does, the reading says it saw only such a notice
(``unknown``: not a refusal to wait on or retry).
"""

from __future__ import annotations

import re

__all__ = ["without_notices"]

_GAP = r"\s{1,4}"
_NOTICES: tuple[tuple[re.Pattern[str], str], ...] = (
    # Gemini CLI's fallback notice, with its "possible reasons" lines when printed.
    # _GAP: a space, or the line break and indent where the terminal wrapped it.
    (re.compile(
        rf"(?:(?:slow response times|rate limiting) detected\.{_GAP})?"
        rf"automatically switching from{_GAP}[^\n]{{1,80}}?{_GAP}to{_GAP}[^\n]{{1,80}}?"
        rf"{_GAP}for faster responses{_GAP}for the{_GAP}remainder of this session\."
        r"(?:[\s⚡]{0,12}possible reasons for this are [^⚡]{0,300}?quota limit\b\.?)?"
    ), "model fallback notice"),
    # Claude Code 1.x: the Opus allowance is spent and the session goes on with Sonnet.
    (re.compile(r"claude [a-z0-9 .-]{1,30}? limit reached, now using [a-z0-9 .-]{1,40}"),
     "model fallback notice"),
    (re.compile(r"approaching [a-z0-9 ]{0,30}?usage limit\b"), "usage warning"),
    # Copilot: "You've used 51% of your weekly rate limit. Your weekly rate limit will
    # reset on April 27 at 8:00 AM."
    (re.compile(
        r"you(?:'|’)ve used \d{1,3}% of your [a-z]{1,10} rate limit\."
        r"(?:\s{1,4}your [a-z]{1,10} rate limit will reset on [^\n]{1,40}?(?:am|pm)\b\.?)?"
    ), "usage warning"),
)
_MARKS = ("switching from", "now using", "approaching", "% of your")


def without_notices(low: str) -> tuple[str, str | None]:
    """``low`` with every fallback notice and usage warning masked, and what was masked
    first (``"model fallback notice"`` / ``"usage warning"``), or ``None``."""
    if not any(mark in low for mark in _MARKS):
        return low, None
    seen: str | None = None
    for pattern, name in _NOTICES:
        low, count = pattern.subn(" ", low)
        if count and seen is None:
            seen = name
    return low, seen
