"""URL schemes, compared the one way RFC 3986 allows: without regard to case.

``REDIS://host`` and ``redis://host`` name the same server (RFC 3986 §3.1:
schemes are case-insensitive, and their canonical form is lower case).
Every place rateloop decides by a URL's scheme (the policy's backend check,
the admission backend registry, task store URLs, ``rateloop status`` and
``rateloop dashboard``) asks :func:`url_scheme`, so that none of them can
compare case-sensitively again; :func:`lower_scheme` gives the canonical
spelling to a client that does.
"""

from __future__ import annotations

import re

__all__ = ["lower_scheme", "url_scheme"]

# RFC 3986 §3.1: scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then ":".
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):")


def url_scheme(url: object) -> str:
    """The scheme of ``url`` in lower case, or ``""`` when it has none (or is not a string).

    >>> url_scheme("REDIS://127.0.0.1:6379/0"), url_scheme("sqlite:///t.db"), url_scheme("h")
    ('redis', 'sqlite', '')
    """
    if not isinstance(url, str):
        return ""
    found = _SCHEME.match(url)
    return found.group(1).lower() if found else ""


def lower_scheme(url: str) -> str:
    """``url`` with its scheme spelt in lower case; the rest is left as it is.

    >>> lower_scheme("Rediss://User:PW@Host:6380/0")
    'rediss://User:PW@Host:6380/0'
    """
    scheme = url_scheme(url)
    return scheme + url[len(scheme) :] if scheme else url
