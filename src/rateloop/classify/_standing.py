"""Refusals that stand: waiting never changes them, whatever the status says.

Each helper returns the canonical phrase it matched in a message, or ``None``.
They are read before the status and the provider's type because relays get
both wrong: a gateway or an agent CLI turns a 400 into a 500, a 403 into a
429, and every one of these is retried forever if the status decides.

* :func:`zero_quota` — **a limit of zero** is not a spent allowance: the
  project has no quota at all for this model ("no free tier").  Gemini says
  "Quota exceeded for metric: … limit: 0, model: gemini-3-pro" (with a
  "Please retry in 10.6s" that no wait ever honours), a ``QuotaFailure``
  violation with ``quotaValue: "0"``, or an ``ErrorInfo`` with
  ``quota_limit_value: "0"``.  ``permission``: an operator must enable
  billing or pick another model.  gemini-cli reads it the same way
  (``packages/core/src/utils/googleQuotaErrors.ts``, "limit: 0" is a
  ``TerminalQuotaError`` even with a retry delay); "limit: 0.5" is a limit.
* :func:`credit_exhausted` — **credits and keys** the shared spend phrases
  do not name: OpenRouter's per-key spend cap ("Key limit exceeded (monthly
  limit)", sent as a 403), its affordability check ("This request requires
  more credits, or fewer max_tokens … can only afford 0"), the "create a key
  with a higher monthly limit" advice and the "Free BYOK request cap".
  ``spend``.
* :func:`must_change` — **requests that must change**: Bedrock's
  "Invocation of model ID … with on-demand throughput isn't supported. Retry
  your request with the ID or ARN of an inference profile", "The maximum
  tokens you requested exceeds the model limit of 4096. Try again with a
  maximum tokens value …" (both say "retry" / "try again" and neither is a
  throttle), and content-filter refusals (Azure's "content management
  policy" / ``ResponsibleAIPolicyViolation``, Anthropic's "Output blocked by
  content filtering policy").  ``invalid``.

Patterns are lowercase and start with a literal, as in
:mod:`rateloop.classify._phrases`, so matching stays linear on hostile text.
"""

from __future__ import annotations

import re

from rateloop.classify._phrases import find

__all__ = ["STANDING", "credit_exhausted", "must_change", "zero_quota"]

_MAX_SCAN = 200_000

_ZERO: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), canonical)
    for pattern, canonical in (
        # "limit: 0, model: …", "limit: 0\nPlease retry", "limit: 0." but not "limit: 0.5"
        (r"limit:\s{0,8}0(?!\d|\.\d)", "limit: 0"),
        # a QuotaFailure / ErrorInfo relayed as text: JSON, a Python dict or gRPC text form
        (r"""quotavalue["']?\s{0,8}:\s{0,8}["']?0(?!\d|\.\d)""", "quotaValue 0"),
        (r"""quota_limit_value["']?\s{0,8}(?:value\s{0,8})?:\s{0,8}["']?0(?!\d|\.\d)""",
         "quota_limit_value 0"),
    )
)
_CREDIT: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), canonical)
    for pattern, canonical in (
        (r"key limit exceeded\b", "key limit exceeded"),
        (r"requires more credits\b", "requires more credits"),
        (r"more credits are required\b", "requires more credits"),
        (r"can only afford\b", "requires more credits"),
        (r"create a key with a higher (?:\w+ )?limit\b", "key limit exceeded"),
        (r"free byok request cap\b", "free byok request cap"),
    )
)
_CHANGE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), canonical)
    for pattern, canonical in (
        (r"on-demand throughput isn['’]t supported", "on-demand throughput isn't supported"),
        (r"doesn['’]t support on-demand throughput", "on-demand throughput isn't supported"),
        (r"maximum tokens you requested exceeds? the model limit", "max tokens over the limit"),
        (r"try again with a maximum tokens value", "max tokens over the limit"),
        (r"content management policy\b", "content filter"),
        (r"responsibleaipolicyviolation\b", "content filter"),
        (r"blocked by content filtering policy\b", "content filter"),
    )
)
#: Every canonical phrase these readers return, and the structured evidence of a
#: zero limit (Gemini's ``quotaValue`` / ``quota_limit_value``): a finding whose
#: ``matched`` is one of them stands, and no later correction turns it into a throttle.
STANDING = frozenset(
    canonical for table in (_ZERO, _CREDIT, _CHANGE) for _, canonical in table
)
_ZERO_WORDS = ("quota",)
_CREDIT_WORDS = ("key limit", "credits", "afford", "byok", "higher")
_CHANGE_WORDS = ("on-demand", "maximum tokens", "content management", "responsibleai",
                 "content filtering")


def _first(
    text: str, words: tuple[str, ...], patterns: tuple[tuple[re.Pattern[str], str], ...]
) -> str | None:
    low = text[:_MAX_SCAN].lower()
    if not any(word in low for word in words):
        return None
    for pattern, canonical in patterns:
        if find(pattern, low) is not None:
            return canonical
    return None


def zero_quota(text: str) -> str | None:
    """Evidence that a quota's limit is zero (no allowance at all), or ``None``.

    The message must speak of a quota: "limit: 0" alone is too common a string.
    """
    return _first(text, _ZERO_WORDS, _ZERO)


def credit_exhausted(text: str) -> str | None:
    """A credit or key-cap phrase the shared spend phrases do not name, or ``None``."""
    return _first(text, _CREDIT_WORDS, _CREDIT)


def must_change(text: str) -> str | None:
    """Evidence that the request itself must change (not a throttle), or ``None``."""
    return _first(text, _CHANGE_WORDS, _CHANGE)
