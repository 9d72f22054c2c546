"""Keep secrets out of what rateloop prints and logs.

:func:`redact` replaces anything shaped like a provider API key or a bearer
token; :func:`redact_url` hides the password of a connection URL.  Events,
errors and the ``rateloop config`` output go through them.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact", "redact_url"]

# Shapes of API keys and bearer tokens of the providers rateloop knows.
_SECRET = re.compile(
    r"(sk-[A-Za-z0-9_\-]{8,}|AIza[A-Za-z0-9_\-]{20,}|gsk_[A-Za-z0-9]{16,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|[Bb]earer[\s_]+\S+)"
)


def redact(text: str) -> str:
    """Replace anything shaped like an API key or a bearer token with ``[redacted]``."""
    return _SECRET.sub("[redacted]", text)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
