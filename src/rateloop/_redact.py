"""Keep secrets out of what rateloop prints and logs: one function, :func:`redact`.

It hides, anywhere in a text:

- anything shaped like a provider API key or a bearer token;
- the password of a URL (``redis://user:pw@host``, ``redis://:pw@host``);
- a secret passed as a URL query parameter (``?password=``, ``&token=``,
  ``api_key=`` ...).

Events, errors (``ConfigError``, ``BackendError``, ``RateLimitExhausted``),
reprs, lock warnings and the ``rateloop config`` output all go through it.
:func:`redact_url` is the same function, kept under the name callers of a
single URL use.
"""

from __future__ import annotations

import re

__all__ = ["redact", "redact_url"]

# Shapes of API keys and bearer tokens of the providers rateloop knows.
_SECRET = re.compile(
    r"(sk-[A-Za-z0-9_\-]{8,}|AIza[A-Za-z0-9_\-]{20,}|gsk_[A-Za-z0-9]{16,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|[Bb]earer[\s_]+\S+)"
)
# scheme://[user]:password@ — the password runs to the last '@' before the host.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'\"]*):[^\s/'\"]*@")
# ?password=... / &token=... in a URL's query (also a bare key=value in a DSN).
_QUERY = re.compile(
    r"(?P<head>[?&;\s](?:password|passwd|pwd|pass|token|secret|api_key|apikey|key)=)"
    r"[^&#\s'\"]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with keys, tokens and URL passwords replaced (``[redacted]``, ``***``).

    >>> redact("redis://u:s3cret@h:6379/0?password=s3cret&db=1 key sk-abcdefghijklmnop")
    'redis://u:***@h:6379/0?password=***&db=1 key [redacted]'
    """
    text = _USERINFO.sub(r"\g<head>:***@", text)
    text = _QUERY.sub(r"\g<head>***", text)
    return _SECRET.sub("[redacted]", text)


def redact_url(url: str) -> str:
    """``url`` with any password hidden (the same rules as :func:`redact`)."""
    return redact(url)
