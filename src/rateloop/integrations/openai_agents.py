"""OpenAI Agents SDK: rateloop's classification and waits as the runner's retry policy.

Two ways in, which combine:

- :func:`use_rateloop_client` makes rateloop's ready ``AsyncOpenAI`` client
  the SDK's default (``set_default_openai_client``): every model request
  then goes through the RATE-loop transport (admission, waits, settlement).
- :func:`retry_policy` is a ``RetryPolicy`` callable
  (``RetryPolicyContext -> RetryDecision``) for
  ``ModelSettings(retry=ModelRetrySettings(policy=...))``, and
  :func:`retry_settings` builds those settings from a
  :class:`~rateloop.Policy`.  It classifies the error with rateloop's
  readers and waits as the loop would (the server's minimum as a floor, the
  policy's backoff and pause limit); it never retries a stream that already
  reached the caller, nor an error the transport already decided on
  (an outcome attached), so retries are never stacked.

The policy sees one call's attempts only, so it bounds retries by
``max_attempts`` and the pause limit; the recovery-time budget is the
transport's (use both for it).  Install with
``pip install 'rateloop[openai-agents]'``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rateloop.classify import classify_exception
from rateloop.integrations._transport import OUTCOME_KEY
from rateloop.integrations.clients import async_openai_client
from rateloop.policy import Policy
from rateloop.timing.backoff import plan_wait
from rateloop.timing.decide import in_trigger_scope

try:
    import agents
    from agents.retry import ModelRetrySettings, RetryDecision, RetryPolicyContext
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'rateloop[openai-agents]'"
    ) from exc

__all__ = ["retry_policy", "retry_settings", "use_rateloop_client"]


def _decided_by_transport(error: BaseException) -> Any:
    """The outcome rateloop's transport attached to ``error``, if it ran the loop already."""
    response = getattr(error, "response", None)
    extensions = getattr(response, "extensions", None)
    if isinstance(extensions, dict) and OUTCOME_KEY in extensions:
        return extensions[OUTCOME_KEY]
    cause = error.__cause__
    return getattr(cause, "rateloop_outcome", None) if cause is not None else None


def retry_policy(
    policy: Policy | None = None, *, rng: Callable[[], float] | None = None
) -> Callable[[RetryPolicyContext], RetryDecision]:
    """A retry policy for the Agents SDK runner that decides as the RATE loop does."""
    pol = policy if policy is not None else Policy()

    def decide(ctx: RetryPolicyContext) -> RetryDecision:
        error = ctx.error
        outcome = _decided_by_transport(error)
        if outcome is not None:
            return RetryDecision(
                retry=False, reason=f"rateloop's transport already decided: {outcome.status.value}"
            )
        if ctx.response_started:
            return RetryDecision(retry=False, reason="the response had started: never replayed")
        signal = classify_exception(error)
        kind = signal.kind
        if not in_trigger_scope(kind, pol.trigger_scope):
            return RetryDecision(retry=False, reason=f"{kind.value} is not retried")
        if ctx.attempt >= pol.max_attempts:
            return RetryDecision(
                retry=False, reason=f"{kind.value}: all {pol.max_attempts} attempts used"
            )
        plan = plan_wait(
            pol.backoff(rng=rng),
            ctx.attempt,
            server_minimum=signal.retry_after,
            pause_limit=pol.pause_limit_secs,
            time_left=None,
        )
        if not plan.fits:
            return RetryDecision(retry=False, reason=plan.reason)
        source = f"server asked for {signal.retry_after:g}s" if signal.retry_after else "backoff"
        return RetryDecision(
            retry=True, delay=plan.seconds, reason=f"{kind.value}; {source}"
        )

    return decide


def retry_settings(
    policy: Policy | None = None, *, rng: Callable[[], float] | None = None
) -> ModelRetrySettings:
    """``ModelRetrySettings`` whose retries and waits are rateloop's (``max_attempts`` - 1)."""
    pol = policy if policy is not None else Policy()
    return ModelRetrySettings(
        max_retries=pol.max_attempts - 1, policy=retry_policy(pol, rng=rng)
    )


def use_rateloop_client(*, use_for_tracing: bool = False, **kwargs: Any) -> Any:
    """Build :func:`rateloop.async_openai_client` and make it the Agents SDK's default client.

    Takes the OpenAI SDK's arguments plus ``policy=`` / ``limiter=`` / ``loop=``;
    returns the client.  Tracing keeps its own client unless ``use_for_tracing``.
    """
    client = async_openai_client(**kwargs)
    agents.set_default_openai_client(client, use_for_tracing=use_for_tracing)
    return client
