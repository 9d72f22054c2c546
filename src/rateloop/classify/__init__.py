"""Read: turn what came back — a response, an exception, a CLI agent's output —
into a :class:`~rateloop.signal.LimitSignal`.

* :func:`classify` — an HTTP status, headers and body (``status=None``: no response).
* :func:`classify_response` — an HTTP-like response object (httpx, requests …).
* :func:`classify_exception` — an exception from openai, anthropic, google-genai,
  httpx / httpx2, botocore, requests or the standard library.
* :func:`classify_text` — the output (and exit code) of a CLI agent.
* :func:`classify_mcp` — an MCP server's tool result or JSON-RPC error.
* :func:`detect_provider` — which provider a response came from.

The rule that matters most: a 429 is a signal to classify, not an order to
retry.  Billing, credit and "exceeded your current quota" are ``spend``; an
exhausted day or month window is ``period_quota``; neither is retryable in the
short loop.  A throttle whose earliest retry is beyond the pause limit is a
spent period too (the far-wait rule, ``pause_limit=`` on every reader).  See
``docs/classify.md``.
"""

from __future__ import annotations

from rateloop.classify._core import classify
from rateloop.classify._detect import PROVIDERS, detect_provider
from rateloop.classify._http import RESET_FIELDS
from rateloop.classify.exceptions import classify_exception, classify_response
from rateloop.classify.mcp import classify_mcp
from rateloop.classify.text import classify_text

__all__ = [
    "PROVIDERS",
    "RESET_FIELDS",
    "classify",
    "classify_exception",
    "classify_mcp",
    "classify_response",
    "classify_text",
    "detect_provider",
]
