"""Read the output of a CLI agent (Claude Code, Copilot CLI, Codex, Gemini CLI).

How it works: exit code 0 is always ``ok``.  Otherwise terminal escape
sequences are removed, the text is cut to :data:`MAX_TEXT_CHARS` (its head
and, mostly, its tail: agents print a refusal last), lowercased once, and
asked, in this order:

0. **Notices that are not refusals** are masked (:mod:`rateloop.classify._notices`):
   a model fallback ("Automatically switching from gemini-2.5-pro to
   gemini-2.5-flash …", "Claude Opus 4 limit reached, now using Sonnet 4") or a
   usage warning ("You've used 51% of your weekly rate limit"); the agent went
   on, so the rest of the output decides (``unknown`` when nothing else does).
1. **What the agent itself printed** (:mod:`rateloop.classify._agent_text`):
   Claude Code's usage, session, weekly and spend limits with their reset
   time, its ``API Error (…) · Retrying in N seconds… (attempt k/10)``
   lines; Codex's usage limit, plan and high-demand messages; Copilot's
   rate limits, premium allowance and 402; Gemini CLI's capacity, quota and
   daily and per-model quotas; Cursor's, Kiro's, Amazon Q's, Qwen Code's,
   Ollama's and Hugging Face's limits (:mod:`rateloop.classify._agent_others`).
   ``code`` then names the allowance the text says ran out
   (:mod:`rateloop.classify._allowance`: ``session_limit``, ``weekly_limit``,
   ``spend_limit``, ``credits``, ``model_limit`` …).  See ``docs/classify.md``
   for every string.
2. Is it **spend** (billing, credit, "exceeded your current quota" outside
   Google)?
3. Can the request **never fit** ("Request too large", "Limit 30000,
   Requested 45000")?  ``invalid``.
4. Is it a **rate limit**?  "hit your rate limit", "too many requests",
   "rate limit" (also ``rate-limit``, ``RateLimitError``, ``ratelimited``), a
   standalone ``429``, "reset in", "resource exhausted", "throttled".  A rate
   limit naming a day window is ``period_quota`` unless its stated wait is
   short; otherwise ``temporary`` with the stated wait.
5. Else overload, permission, network or server-error phrases; else
   ``unknown``.

Then the far-wait rule (:mod:`rateloop.classify._far`): a throttle whose
earliest retry is beyond the pause limit is ``period_quota``.

Matching respects word boundaries: "preset installed" has no "reset in",
"processed 14290 files" has no 429.  ``matched`` is the canonical lowercase
phrase, e.g. ``"hit your rate limit"``.
"""

from __future__ import annotations

import re
from datetime import datetime, tzinfo

from rateloop.classify._agent_text import AGENT_READERS, Reading
from rateloop.classify._core import resolve_now
from rateloop.classify._far import far_wait_threshold, settle_kind
from rateloop.classify._notices import without_notices
from rateloop.classify._phrases import (
    dimension_of,
    find,
    find_all,
    never_fits,
    period_of,
    spend_of,
    wait_in,
)
from rateloop.classify._standing import credit_exhausted, must_change, zero_quota
from rateloop.classify._time import add_seconds
from rateloop.signal import Kind, LimitSignal

__all__ = ["MAX_TEXT_CHARS", "classify_text"]

#: How much of an agent's output is read: the first 4 000 and the last
#: 28 000 characters.  Agents print a refusal last; reading more only costs
#: time (every input up to this size is read in well under 50 ms).
MAX_TEXT_CHARS = 32_000
_HEAD_CHARS = 4_000

# CSI (ESC [ params final), OSC (ESC ] … BEL or ESC \), and two-byte escapes.
# Each alternative stops at the next ESC (and an OSC at the end of its line), so
# no input makes it backtrack: the old OSC pattern ran to the end of the text
# from every "ESC ]" (quadratic), and an unterminated one swallowed the rest.
_ANSI = re.compile(
    r"\x1b\[[0-9;?<=>]{0,64}[ -/]{0,8}[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)?"  # OSC, ended by BEL or ST (or the line)
    r"|\x1b[@-Z\\-_]"  # two-byte escapes
)

_RATE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), canonical)
    for pattern, canonical in (
        (r"hit your rate[\s_-]?limit", "hit your rate limit"),
        (r"too many requests\b", "too many requests"),
        (r"rate[\s_-]?limit", "rate limit"),
        (r"reset in\b", "reset in"),
        (r"resource[\s_-]?exhausted\b|resource has been exhausted\b", "resource exhausted"),
        (r"speed[\s_-]limited\b|limited to speed\b", "rate limit"),
        (r"throttl(?:ed|ing)", "throttled"),
    )
)
_STANDALONE_429 = re.compile(r"429(?![\w.])(?!:\d)")
_OTHER: tuple[tuple[re.Pattern[str], str, Kind], ...] = tuple(
    (re.compile(pattern), canonical, kind)
    for pattern, canonical, kind in (
        (r"overloaded(?:_error)?\b|over capacity\b|at capacity\b", "overloaded", Kind.OVERLOAD),
        (r"529(?![\w.])", "529", Kind.OVERLOAD),
        (r"authentication (?:failed|error|required)\b", "authentication failed",
         Kind.PERMISSION),
        (r"unauthori[sz]ed\b", "unauthorized", Kind.PERMISSION),
        (r"invalid (?:api[ _-]?key|x-api-key|bearer token|token)\b|api key not valid\b",
         "invalid api key", Kind.PERMISSION),
        (r"not logged in\b|please run /login\b", "not logged in", Kind.PERMISSION),
        (r"40[13](?![\w.])", "401", Kind.PERMISSION),
        (r"(?:error|status|http)(?: code)?:? ?4(?:00|04|13|22)\b", "4xx", Kind.INVALID),
        (r"econnreset\b|connection reset\b", "connection reset", Kind.NETWORK),
        (r"etimedout\b|connection timed out\b|request timed out\b", "timed out", Kind.NETWORK),
        (r"econnrefused\b|connection refused\b", "connection refused", Kind.NETWORK),
        (r"socket hang up\b|network error\b|fetch failed\b|enotfound\b|connection error\b|"
         r"stream disconnected\b|error sending request\b", "network error", Kind.NETWORK),
        (r"internal server error\b|bad gateway\b|service unavailable\b|gateway timeout\b|"
         r"(?:http|status|api error:?)\s?50[0234]\b",
         "server error", Kind.SERVER_ERROR),
    )
)


def _window(text: str) -> str:
    if len(text) > MAX_TEXT_CHARS:
        text = text[:_HEAD_CHARS] + "\n" + text[-(MAX_TEXT_CHARS - _HEAD_CHARS) :]
    return text


def _clean(text: str) -> str:
    """The window, without escape sequences, lowercased (cut again: lowering
    can lengthen text, "İ" becomes two characters)."""
    return _window(_ANSI.sub("", _window(text)).lower())


def _standalone_429(low: str) -> bool:
    for match in find_all(_STANDALONE_429, low, also="."):
        if low[max(0, match.start() - 5) : match.start()] != "line ":
            return True
    return False


def _rate_limit(low: str) -> Reading | None:
    canonical = None
    for pattern, phrase in _RATE:
        if find(pattern, low) is not None:
            canonical = phrase
            break
    if canonical is None and _standalone_429(low):
        canonical = "429"
    if canonical is None:
        return None
    wait = wait_in(low)
    period = period_of(low)
    if period is not None:
        return Reading(Kind.PERIOD_QUOTA, canonical, wait=wait, dimension=period[1],
                       soft_period=True)
    return Reading(Kind.TEMPORARY, canonical, wait=wait, dimension=dimension_of(low))


def _generic(low: str) -> Reading:
    spend = spend_of(low)
    if spend is not None:
        return Reading(Kind.SPEND, spend)
    too_large = never_fits(low)
    if too_large is not None:
        return Reading(Kind.INVALID, too_large)
    reading = _rate_limit(low)
    if reading is not None:
        return reading
    for pattern, canonical, kind in _OTHER:
        match = find(pattern, low, also="." if canonical in ("529", "401") else "")
        if match:
            matched = canonical if canonical != "401" else match.group(0)
            return Reading(kind, matched)
    wait = wait_in(low)
    if wait is not None:
        # "please wait a moment and try again in 12702s": a wait asked for, no other word.
        return Reading(Kind.TEMPORARY, "stated wait", wait=wait)
    return Reading(Kind.UNKNOWN, "")


def _standing_reading(low: str) -> Reading | None:
    """A provider's refusal that no wait fixes, relayed as text (the same phrases Read
    takes from HTTP bodies, :mod:`~rateloop.classify._standing`): a request that must
    change is ``invalid``, a zero quota ``permission``, a credit or key cap ``spend``
    — before any agent reader or its "Please retry in 25s" can make it a throttle."""
    change = must_change(low)  # in the order of the HTTP readers (_rules.throttle)
    if change is not None:
        return Reading(Kind.INVALID, change)
    zero = zero_quota(low)
    if zero is not None:
        return Reading(Kind.PERMISSION, zero)
    credit = credit_exhausted(low)
    if credit is not None:
        return Reading(Kind.SPEND, credit)
    return None


def read_text(low: str, now: datetime, tz: tzinfo | None) -> Reading:
    """The reading of cleaned, lowercased output (no far-wait rule yet)."""
    low, notice = without_notices(low)
    standing = _standing_reading(low)
    if standing is not None:
        return standing
    for reader in AGENT_READERS:
        reading = reader(low, now, tz)
        if reading is not None:
            return reading
    reading = _generic(low)
    if reading.kind is Kind.UNKNOWN and notice is not None:
        return Reading(Kind.UNKNOWN, notice)
    return reading


def classify_text(
    text: str,
    *,
    exit_code: int | None = None,
    now: datetime | None = None,
    pause_limit: float | None = None,
    tz: tzinfo | None = None,
) -> LimitSignal:
    """Classify a CLI agent's output; exit code 0 is always ``ok``.

    ``pause_limit`` (seconds) is the far-wait threshold: a throttle whose
    earliest retry is further away is ``period_quota`` (default:
    ``Policy().pause_limit_secs``).  ``tz`` is the zone the agent printed
    local times in when it names none (default: this machine's).  Never
    raises on any text; waits are within [0, 86400] seconds.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise TypeError(f"exit_code must be an int or None, got {exit_code!r}")
    if tz is not None and not isinstance(tz, tzinfo):
        raise TypeError(f"tz must be a datetime.tzinfo or None, got {tz!r}")
    moment = resolve_now(now)
    threshold = far_wait_threshold(pause_limit)
    if exit_code == 0:
        return LimitSignal.of(Kind.OK)
    reading = read_text(_clean(text), moment, tz)
    kind, reset_at = settle_kind(
        reading.kind, wait=reading.wait, reset_at=reading.reset_at, now=moment,
        threshold=threshold, soft_period=reading.soft_period,
    )
    if kind is Kind.PERIOD_QUOTA and reset_at is None:
        reset_at = add_seconds(moment, reading.wait)
    return LimitSignal.of(
        kind,
        retry_after=reading.wait,
        reset_at=reset_at,
        matched=reading.matched or None,
        provider=reading.provider,
        dimension=reading.dimension,
        code=reading.code,
    )
