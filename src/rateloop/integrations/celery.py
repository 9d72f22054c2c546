"""Celery: tasks whose model or tool call runs through the RATE loop; Celery holds the long waits.

``@rateloop_task(app, route=...)`` (or ``@app.task(base=RateLoopTask, route=...)``) makes a
Celery task whose function is the loop's attempt: ``fn(route, *args, **kwargs)``.  Each
delivery runs one :meth:`RateLoop.call` with admission shared in Redis by every worker (the
policy's ``[admission]`` backend), and its :class:`~rateloop.Outcome` becomes what Celery does
next, through the one engine mapping (:func:`rateloop.integrations._engine.verdict`):

- ``completed`` / ``degraded`` → the task returns the value (``degraded`` is logged and passed
  to ``on_outcome`` as such); with ``marked=True`` it returns
  ``{"value", "degraded", "model", "reason"}`` so the caller's ``.get()`` sees the mark;
- ``waiting_for_reset`` / ``waiting_for_capacity`` → ``self.retry(countdown=...)`` until the
  outcome's ``retry_at``: the message goes back to the broker and the worker slot is free.
  Waits within the policy's ``pause_limit_secs`` are slept inside the task;
- ``needs_operator`` / ``invalid`` / ``rejected`` / ``failed_retry_exhausted`` → the task fails
  with :class:`TaskGaveUp` (its ``status`` and ``reason``), and is never retried.

Celery's retries and rateloop's budget do not multiply: each delivery's loop is charged the
deliveries before it (``request.retries``, through
:func:`~rateloop.integrations._engine.engine_run_budget`),
and the task's ``max_retries`` is the policy's ``max_attempts``, so rateloop's budget ends first.

Writes (``idempotent=False``) get an idempotency key (the Celery task id, the same on every
retry and redelivery; ``apply_async(task_id=...)`` chooses it), passed to the function as
``idempotency_key=``, and a record of it in Redis (:class:`~._celery.keys.WriteKeys`): a write
that finished is never run again (its stored result is returned), and a delivery that finds
an earlier one's write unanswered (its worker was killed) asks ``outcome_check(ctx, route)``
first, the rule of :mod:`rateloop.tasks` (:func:`rateloop.tasks.flow.earlier_write`).

Celery runs tasks synchronously (it has no asyncio tasks), so there is one, blocking, form.
Install with ``pip install 'rateloop[celery]'``.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from rateloop._redact import redact
from rateloop.admission import Limiter
from rateloop.errors import RateloopError
from rateloop.integrations._engine import (
    EngineVerdict,
    Finish,
    GiveUp,
    RetryLater,
    engine_run_budget,
    verdict,
)
from rateloop.loop import RateLoop
from rateloop.outcome.record import Outcome, Status
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.tasks.definition import Step, StepContext
from rateloop.tasks.flow import CheckWrite, earlier_write
from rateloop.tasks.runner import check_write

try:
    from celery import Task  # type: ignore[import-untyped]
    from celery.exceptions import Reject  # type: ignore[import-untyped]
    from celery.utils.log import get_task_logger  # type: ignore[import-untyped]
    from kombu.exceptions import OperationalError
    from kombu.serialization import dumps, loads, prepare_accept_content
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "rateloop.integrations.celery needs celery: pip install 'rateloop[celery]'"
    ) from exc

from rateloop.integrations._celery.engine import (
    WORKER_SETTINGS,
    BrokerUnreachable,
    check_engine,
    configure,
    unreachable_broker,
)
from rateloop.integrations._celery.keys import WriteKeys
from rateloop.integrations._celery.settings import Settings, check_settings, class_hook

__all__ = [
    "WORKER_SETTINGS",
    "BrokerUnreachable",
    "EngineVerdict",
    "Finish",
    "GiveUp",
    "RateLoopTask",
    "RetryLater",
    "TaskGaveUp",
    "WriteKeys",
    "check_engine",
    "configure",
    "rateloop_task",
]

logger = get_task_logger(__name__)

#: Celery options that would take the retries away from the loop, with the reason.
_REFUSED = {
    "max_retries": "it is the policy's max_attempts (set max_attempts in the policy)",
    "autoretry_for": "Celery would retry on top of the loop's own retries",
    "bind": "the task's function receives the route first, not the task",
}


class TaskGaveUp(RateloopError):
    """A task's call ended in a terminal outcome; Celery must not retry it.

    ``status`` is the outcome's (``needs_operator``, ``invalid``, ``rejected``,
    ``failed_retry_exhausted``) and ``reason`` its sentence.  Its arguments are the two
    strings, so the result backend rebuilds it for ``AsyncResult.get()``.
    """

    def __init__(self, status: str, reason: str) -> None:
        self.status, self.reason = status, redact(reason)
        super().__init__(status, self.reason)

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


class RateLoopTask(Task):  # type: ignore[misc]  # celery is untyped
    """A Celery task base whose function runs through the RATE loop (see the module).

    Set the attributes with ``@app.task(base=RateLoopTask, route=..., policy=...)`` or, checked
    when the task is defined, with :func:`rateloop_task`: ``route`` (required), ``policy``,
    ``limiter`` (a Limiter, or a zero-argument callable building one in each worker process;
    default: the policy's ``[admission]`` backend), ``loop`` (a RateLoop to use instead),
    ``call_options`` (``cost``, ``fallbacks``, ``operation``, ``priority``, ``deadline``,
    ``data_class``), ``idempotent``, ``outcome_check(ctx, route)``, ``write_keys`` (a Redis URL
    or a :class:`WriteKeys`), ``on_outcome(task, verdict)``, called after each delivery, and
    ``marked`` (return ``{"value", "degraded", "model", "reason"}`` instead of the value).
    """

    acks_late = True
    reject_on_worker_lost = True
    typing = False  # the function's first parameter is the route: callers do not pass it

    route: Route | None = None
    policy: Policy | None = None
    limiter: Any = None
    loop: RateLoop | None = None
    call_options: Mapping[str, Any] = MappingProxyType({})
    idempotent: bool = True
    outcome_check: Callable[[StepContext, Route], Any] | None = None
    write_keys: str | WriteKeys | None = None
    on_outcome: Callable[[Any, EngineVerdict], None] | None = None
    marked: bool = False

    _build_lock = threading.Lock()

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        """Celery's, with a broker that cannot be reached as one :class:`BrokerUnreachable`."""
        try:
            return super().apply_async(*args, **kwargs)
        except OperationalError as exc:
            raise unreachable_broker(self.app, exc) from exc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        settings, loop, keys = self._resources()
        request = self.request
        key = request.id if not self.idempotent else None
        if not self.idempotent and key is None:
            raise TypeError(f"the write task {self.name} has no task id to key its write on: "
                            "run it with delay() / apply_async() / apply(), not as a function")
        run = loop.replace(run_budget=engine_run_budget(
            settings.policy, prior_attempts=int(request.retries or 0)))
        if keys is None:
            outcome = self._call(run, settings, args, kwargs, key)
        else:
            assert key is not None
            outcome = self._write(run, settings, keys, args, kwargs, key)
        return self._act(settings, verdict(outcome, now=run.clock.now()))

    # --- one delivery -------------------------------------------------------------------

    def _call(self, loop: RateLoop, settings: Settings, args: Sequence[Any],
              kwargs: Mapping[str, Any], key: str | None,
              check: Callable[[Route], Any] | None = None) -> Outcome:
        fn = self.run

        def attempt(route: Route, **extra: Any) -> Any:
            return fn(route, *args, **kwargs, **extra)

        return loop.call(attempt, route=settings.route, idempotent=self.idempotent,
                         idempotency_key=key, outcome_check=check, task_id=self.request.id,
                         **settings.options)

    def _write(self, loop: RateLoop, settings: Settings, keys: WriteKeys,
               args: Sequence[Any], kwargs: Mapping[str, Any], key: str) -> Outcome:
        """A keyed write: run it at most once per key, whatever the deliveries."""
        token = f"{os.getpid()}:{uuid.uuid4().hex}"
        context = StepContext(task_id=key, step=self.name, index=0,
                              args={"args": list(args), "kwargs": dict(kwargs)}, results={},
                              idempotency_key=key, delivery=int(self.request.retries or 0) + 1)
        user_check = settings.outcome_check
        step = Step(name=self.name, fn=self.run, route=settings.route, idempotent=False,
                    fallbacks=tuple(settings.options.get("fallbacks") or ()),
                    outcome_check=user_check)
        for _ in range(3):  # a mark that moves under us (a duplicate delivery) is read again
            begun = keys.begin(key, token)
            if begun.state == "done":
                value = loads(  # type: ignore[no-untyped-call]
                    begun.payload, begun.content_type, begun.content_encoding,
                    accept=self._accept())
                return Outcome(status=Status.COMPLETED, value=value,
                               reason="the write was done by an earlier delivery")
            if begun.state == "in_doubt":
                settled = _drive_check(earlier_write(step, context))
                if settled is not None:  # applied (done, result None), or needs_operator
                    if settled.ok:
                        self._record_done(keys, key, None)
                    return settled
                if not keys.take_over(key, begun.holder or "", token):
                    continue
            check = (lambda route: user_check(context, route)) if user_check else None
            outcome = self._call(loop, settings, args, kwargs, key, check)
            if outcome.ok:
                self._record_done(keys, key, outcome.value)
            elif outcome.status is not Status.NEEDS_OPERATOR:  # answered: nothing landed
                keys.clear(key, token)
            return outcome
        return Outcome(status=Status.NEEDS_OPERATOR,
                       reason=f"unknown_outcome: the write of key {key!r} is being run by "
                              "another delivery at the same time")

    def _record_done(self, keys: WriteKeys, key: str, value: Any) -> None:
        serializer = self.app.conf.result_serializer or "json"
        content_type, encoding, payload = dumps(  # type: ignore[no-untyped-call]
            value, serializer=serializer)
        keys.finish(key, payload if isinstance(payload, bytes) else payload.encode(encoding),
                    content_type, encoding)

    def _accept(self) -> Any:
        conf = self.app.conf
        return prepare_accept_content(  # type: ignore[no-untyped-call]
            conf.result_accept_content or conf.accept_content)

    def _act(self, settings: Settings, decided: EngineVerdict) -> Any:
        hook = settings.on_outcome
        if hook is not None:
            hook(self, decided)
        match decided:
            case Finish(value=value, degraded=degraded):
                if degraded:
                    logger.info("%s[%s] finished degraded (on an approved fallback)",
                                self.name, self.request.id)
                if settings.marked:
                    done = decided.outcome
                    return {"value": value, "degraded": degraded,
                            "model": done.route.model if done.route is not None else None,
                            "reason": done.reason}
                return value
            case RetryLater(delay_secs=delay, status=status):
                logger.info("%s[%s] %s: retry in %.1f s", self.name, self.request.id, status,
                            delay)
                try:
                    # Celery's count never ends first: rateloop's budget (charged each
                    # delivery by request.retries) runs out at max_attempts.
                    raise self.retry(countdown=delay,
                                     max_retries=settings.policy.max_attempts)
                except Reject as exc:  # the retry could not be published: never drop it
                    raise Reject(f"the retry could not be published: {exc}",
                                 requeue=True) from exc
            case GiveUp(status=status, reason=reason):
                raise TaskGaveUp(status, reason) from decided.error

    # --- per worker process ---------------------------------------------------------------

    def _resources(self) -> tuple[Settings, RateLoop, WriteKeys | None]:
        """The settings, loop and key record of this process (built after a fork, once)."""
        cached = self.__dict__.get("_rateloop_cache")
        if cached is not None and cached[0] == os.getpid():
            return cached[1]  # type: ignore[no-any-return]
        with self._build_lock:
            cls = type(self)
            settings = check_settings(
                route=self.route, policy=self.policy, loop=self.loop,
                idempotent=self.idempotent, outcome_check=class_hook(cls, "outcome_check"),
                write_keys=self.write_keys, on_outcome=class_hook(cls, "on_outcome"),
                options=self.call_options, marked=self.marked)
            loop = self.loop
            if loop is None:
                limiter = class_hook(cls, "limiter")
                if limiter is None:
                    limiter = Limiter.from_policy(settings.policy)
                elif callable(limiter) and not hasattr(limiter, "try_reserve"):
                    limiter = limiter()
                loop = RateLoop(settings.policy, limiter=limiter)
            keys = settings.write_keys
            if isinstance(keys, str):
                keys = WriteKeys(keys)
            built = (settings, loop, keys)
            self.__dict__["_rateloop_cache"] = (os.getpid(), built)
            return built


def _drive_check(flow: Generator[Any, Any, Outcome | None]) -> Outcome | None:
    """Run :func:`earlier_write`'s checks (its only effect here is ``CheckWrite``)."""
    reply: Any = None
    while True:
        try:
            effect = flow.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        assert isinstance(effect, CheckWrite)
        reply = check_write(effect)


def rateloop_task(
    app: Any,
    *,
    route: Route,
    policy: Policy | None = None,
    limiter: Any = None,
    loop: RateLoop | None = None,
    idempotent: bool = True,
    outcome_check: Callable[[StepContext, Route], Any] | None = None,
    write_keys: str | WriteKeys | None = None,
    on_outcome: Callable[[Any, EngineVerdict], None] | None = None,
    call_options: Mapping[str, Any] | None = None,
    marked: bool = False,
    **celery_options: Any,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorate ``fn(route, *args, **kwargs)`` into a :class:`RateLoopTask` of ``app``.

    The arguments are checked now (a bad one raises naming it and what is allowed);
    ``celery_options`` go to ``app.task`` (``name``, ``queue``, ``acks_late``...), except
    ``max_retries`` (the policy's ``max_attempts``), ``autoretry_for`` and ``bind``.
    """
    for name, why in _REFUSED.items():
        if name in celery_options:
            raise TypeError(f"rateloop_task does not take {name}=: {why}")
    settings = check_settings(route=route, policy=policy, loop=loop, idempotent=idempotent,
                         outcome_check=outcome_check, write_keys=write_keys,
                         on_outcome=on_outcome, options=call_options or {}, marked=marked)

    def decorate(fn: Callable[..., Any]) -> Any:
        if not callable(fn):
            raise TypeError(f"rateloop_task decorates a function, got {type(fn).__name__}")
        return app.task(
            base=RateLoopTask, route=settings.route, policy=settings.policy, limiter=limiter,
            loop=loop, idempotent=idempotent, outcome_check=outcome_check,
            write_keys=settings.write_keys, on_outcome=on_outcome,
            call_options=settings.options, marked=settings.marked,
            max_retries=settings.policy.max_attempts,
            **celery_options,
        )(fn)

    return decorate
