"""``classify``: one HTTP response (or its absence) in, one :class:`LimitSignal` out.

How it works:

1. :func:`~rateloop.classify._evidence.gather` normalizes the headers and body;
   headers a gateway nested in the body (OpenRouter) are lifted out.
2. The provider is the caller's, else :func:`detect_provider`'s guess.
3. Failures inside a 2xx envelope (MiniMax ``base_resp``, Zhipu codes, an
   error object in a 200 body or stream) are read first
   (:func:`~rateloop.classify._traps.envelope`).  Then provider rules run,
   the detected provider's first; the first that recognises the response
   wins.  When none does, :func:`~rateloop.classify._rules.by_status` decides
   from the status code and the shared spend / period / throttle phrases.
   :func:`~rateloop.classify._traps.reconcile` then corrects a finding that
   stronger evidence contradicts (a spend phrase in a 500, a rate limit sent
   as ``invalid_request_error``).
4. The signal is completed from generic evidence: the largest server-stated
   minimum wait (``retry-after-ms``, ``retry-after``, a wait in the message,
   then JSON reset fields), the observed limits (on every response, 200s
   included), the exhausted dimension, ``reset_at`` and the request id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime

from rateloop._clock import system_clock
from rateloop.classify import anthropic, bedrock, google, openai, others, tools
from rateloop.classify._detect import detect
from rateloop.classify._evidence import BodyLike, Evidence, Finding, HeadersLike, gather
from rateloop.classify._far import far_wait_threshold, settle_kind
from rateloop.classify._http import body_reset, exhausted, observe, retry_after_raw
from rateloop.classify._rules import by_status
from rateloop.classify._time import add_seconds
from rateloop.classify._traps import envelope, reconcile
from rateloop.signal import MAX_WAIT_SECONDS, Kind, LimitSignal, Observed

__all__ = ["classify", "classify_hinted", "resolve_now", "signal_from"]

Rule = Callable[[Evidence], Finding | None]

_RULES: tuple[tuple[str, Rule], ...] = (
    ("anthropic", anthropic.rule),
    ("bedrock", bedrock.rule),
    ("google", google.rule),
    ("github", others.github_rule),
    ("github", tools.github_graphql_rule),
    ("slack", others.slack_rule),
    ("discord", tools.discord_rule),
    ("notion", tools.notion_rule),
    ("atlassian", tools.atlassian_rule),
    ("brave", tools.brave_rule),
    ("mistral", others.mistral_rule),
    ("groq", others.groq_rule),
    ("openrouter", others.openrouter_rule),
    ("openai", openai.rule),
)
_PROVIDER_RULE = {"azure": "openai"}

_REQUEST_ID_HEADERS = (
    "request-id",
    "x-request-id",
    "x-amzn-requestid",
    "x-github-request-id",
    "apim-request-id",
    "x-slack-req-id",
    "x-goog-request-id",
    "x-ms-request-id",
)


def resolve_now(now: datetime | None) -> datetime:
    """``now`` checked to be aware, or the system clock's time."""
    if now is None:
        return system_clock.now()
    if not isinstance(now, datetime):
        raise TypeError(f"now must be an aware datetime, got {type(now).__name__}: {now!r}")
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, got naive {now!r}")
    return now


def _ordered(provider: str | None) -> list[Rule]:
    first = _PROVIDER_RULE.get(provider or "", provider)
    return [r for name, r in _RULES if name == first] + [r for name, r in _RULES if name != first]


def _request_id(ev: Evidence, finding: Finding) -> str | None:
    if finding.request_id:
        return finding.request_id
    for name in _REQUEST_ID_HEADERS:
        value = ev.header(name)
        if value:
            return value
    if isinstance(ev.data, Mapping):
        value = ev.data.get("request_id")
        if isinstance(value, str) and value:
            return value
    return None


def _carries_error(ev: Evidence) -> bool:
    """Whether a 2xx body says it is an error (an SSE error, Slack ``ok: false`` …)."""
    if ev.sse_error:
        return True
    data = ev.data[0] if isinstance(ev.data, list) and ev.data else ev.data
    if not isinstance(data, Mapping):
        return False
    return data.get("type") == "error" or data.get("ok") is False or "error" in data


def signal_from(ev: Evidence, *, threshold: float | None = None) -> LimitSignal:
    """The signal for normalized evidence (provider already resolved).

    ``threshold`` is the far-wait threshold in seconds (default: the policy's
    default pause limit); see :mod:`rateloop.classify._far`.
    """
    ev = tools.prepared(ev)
    observed: tuple[Observed, ...] = observe(ev.headers, ev.now, provider=ev.provider)
    finding: Finding | None = envelope(ev) if ev.status is not None else None
    refused = ev.status is not None and (
        ev.status >= 300 or _carries_error(ev) or tools.carries_error(ev)
    )
    if finding is None and refused:
        for rule in _ordered(ev.provider):
            finding = rule(ev)
            if finding is not None:
                break
    if finding is None:
        finding = by_status(ev)
    return _finish(ev, reconcile(ev, finding), observed, far_wait_threshold(threshold))


def _finish(
    ev: Evidence, finding: Finding, observed: tuple[Observed, ...], threshold: float
) -> LimitSignal:
    kind = finding.kind
    matched = finding.matched
    reset_at = finding.reset_at
    wait = finding.retry_after  # unclamped: the far-wait rule needs the real distance
    dimension = finding.dimension
    malformed: tuple[str, ...] = ()
    if kind not in (Kind.OK, Kind.NETWORK):
        header = retry_after_raw(ev.headers, ev.now)
        malformed = header.malformed
        if header.seconds is not None and (wait is None or header.seconds > wait):
            wait = header.seconds
        if header.seconds is not None and header.seconds > MAX_WAIT_SECONDS and reset_at is None:
            # The wait is clamped to a day; the reset time keeps what the server asked.
            reset_at = header.moment or add_seconds(ev.now, header.seconds)
        if matched is None:
            matched = header.name or (str(ev.status) if ev.status is not None else None)
        if wait is None or reset_at is None:
            body_wait, body_at, _ = body_reset(ev.data, ev.now)
            wait = body_wait if wait is None else wait
            reset_at = body_at if reset_at is None else reset_at
        # A refusal of another capacity pool (flex) says nothing about the route's own
        # windows: an empty one in its headers is no wait for it.
        gone = exhausted(observed) if finding.scope is None else ()
        if kind in (Kind.TEMPORARY, Kind.PERIOD_QUOTA) and gone:
            hit = [g for g in gone if g.dimension == dimension] or gone
            if dimension is None and len(gone) == 1:
                dimension = gone[0].dimension
            resets = [g.reset_after for g in hit if g.reset_after is not None]
            if resets and kind is Kind.TEMPORARY and wait is None:
                wait = max(resets)
            if resets and kind is Kind.PERIOD_QUOTA and reset_at is None:
                reset_at = add_seconds(ev.now, max(resets))
        kind, reset_at = settle_kind(
            kind, wait=wait, reset_at=reset_at, now=ev.now, threshold=threshold,
            soft_period=finding.soft_period,
        )
        if kind is Kind.PERIOD_QUOTA and reset_at is None:
            reset_at = add_seconds(ev.now, wait)
    return LimitSignal.of(
        kind,
        retry_after=wait,
        reset_at=reset_at,
        dimension=dimension,
        provider=ev.provider,
        request_id=_request_id(ev, finding),
        status=ev.status,
        code=finding.code,
        matched=matched,
        # A tool's limit names the tool's scope; a provider's tier (flex) names the tier.
        scope=finding.scope or tools.tool_scope(ev, finding),
        observed=observed,
        malformed=malformed,
    )


def classify(
    status: int | None,
    headers: HeadersLike = None,
    body: BodyLike = None,
    *,
    provider: str | None = None,
    now: datetime | None = None,
    pause_limit: float | None = None,
) -> LimitSignal:
    """Classify one HTTP response; ``status=None`` means no response arrived.

    ``headers`` is any mapping or iterable of pairs (names matched
    case-insensitively); ``body`` is text, bytes, a parsed JSON mapping or
    ``None``.  ``provider`` overrides detection; ``now`` (aware) turns dates
    into waits and defaults to the system clock.  ``pause_limit`` (seconds)
    is the far-wait threshold: a throttle whose earliest retry is further
    away is ``period_quota`` (default: ``Policy().pause_limit_secs``).  Never
    raises on hostile response content; waits are always within [0, 86400]
    seconds.
    """
    return classify_hinted(
        status, headers, body, provider=provider, hint=None, now=now, pause_limit=pause_limit
    )


def classify_hinted(
    status: int | None,
    headers: HeadersLike,
    body: BodyLike,
    *,
    provider: str | None,
    hint: str | None,
    now: datetime | None,
    pause_limit: float | None,
) -> LimitSignal:
    """:func:`classify`, where ``hint`` names the provider when the response
    itself does not (its headers and body are read once for both: an
    exception's 1 MB body is decoded once, not for detection and again)."""
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
        raise TypeError(f"status must be an int HTTP status or None, got {status!r}")
    if provider is not None and not isinstance(provider, str):
        raise TypeError(f"provider must be a string or None, got {provider!r}")
    moment = resolve_now(now)
    threshold = far_wait_threshold(pause_limit)
    given = provider.strip().lower() or None if provider else None
    try:
        return read_response(
            status, headers, body, provider=given, hint=hint, now=moment, pause_limit=threshold
        )
    except Exception:  # a reader bug must not take the caller's loop down
        fallback = given or hint
        return _fallback(status, headers, body, provider=fallback, now=moment, threshold=threshold)


def _fallback(
    status: int | None,
    headers: HeadersLike,
    body: BodyLike,
    *,
    provider: str | None,
    now: datetime,
    threshold: float,
) -> LimitSignal:
    """What is left when a provider reader failed: the status, the headers and
    the body's *text* (its phrases still tell a day quota from a short throttle);
    the status alone when even that fails."""
    try:
        ev = gather(status, headers, body, now=now, provider=provider)
        plain = replace(ev, data=None, sse_error=False)
        return _finish(plain, by_status(plain), (), threshold)
    except Exception:
        bare = Evidence(status=status, headers={}, text="", data=None, now=now, provider=provider)
        return _finish(bare, by_status(bare), (), threshold)


def read_response(
    status: int | None,
    headers: HeadersLike,
    body: BodyLike,
    *,
    provider: str | None,
    now: datetime,
    pause_limit: float | None = None,
    hint: str | None = None,
) -> LimitSignal:
    """The classification itself, without :func:`classify`'s safety net.

    The property tests call this, so a reader bug shows up as a failure
    instead of hiding behind the status-only fallback.  ``hint`` is the
    provider when detection on the response as given (before gateway-nested
    headers are merged, as :func:`detect_provider` reads it) finds none.
    """
    ev = gather(status, headers, body, now=now, provider=None)
    if provider is None and hint is not None:
        provider = detect(ev.headers, None if ev.sse_error else ev.data, ev.text) or hint
    nested = others.nested_headers(ev)
    if nested:
        ev = replace(ev, headers={**nested, **ev.headers})
    name = provider or detect(ev.headers, ev.data, ev.text)
    return signal_from(replace(ev, provider=name), threshold=pause_limit)
