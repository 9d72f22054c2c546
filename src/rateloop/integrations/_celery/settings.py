"""A Celery task's rateloop settings, checked once: at definition (``rateloop_task``) and in
each worker process (``RateLoopTask``), so both doors refuse the same bad values."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from rateloop._clock import system_clock
from rateloop._url import url_scheme
from rateloop.integrations._celery.keys import WriteKeys
from rateloop.integrations._engine import EngineVerdict
from rateloop.loop import RateLoop
from rateloop.loop.args import call_spec, check_policy
from rateloop.policy import Policy
from rateloop.route import Route
from rateloop.tasks.definition import StepContext

__all__ = ["CALL_OPTIONS", "Settings", "check_settings", "class_hook"]

#: Options of the loop's call a task may set (everything else of RateLoop.call is the task's own).
CALL_OPTIONS = ("cost", "fallbacks", "operation", "priority", "deadline", "data_class")


@dataclass(frozen=True, slots=True)
class Settings:
    """A task's rateloop settings, checked."""

    policy: Policy
    route: Route
    options: Mapping[str, Any]
    write_keys: str | WriteKeys | None
    outcome_check: Callable[[StepContext, Route], Any] | None
    on_outcome: Callable[[Any, EngineVerdict], None] | None
    marked: bool = False


def class_hook(cls: type, name: str) -> Any:
    """A callable class attribute as given: ``app.task(on_outcome=fn)`` stores ``fn`` on the
    task's class, where reading it through the task would bind it as a method."""
    value = inspect.getattr_static(cls, name, None)
    return value.__func__ if isinstance(value, staticmethod) else value


def check_settings(
    *, route: object, policy: object, loop: object, idempotent: object, outcome_check: object,
    write_keys: object, on_outcome: object, options: Mapping[str, Any], marked: object = False,
) -> Settings:
    """Check a task's rateloop arguments; a bad one raises naming it and what is allowed."""
    if loop is not None and not isinstance(loop, RateLoop):
        raise TypeError(f"loop must be a rateloop.RateLoop (Celery tasks are blocking), got "
                        f"{type(loop).__name__}")
    checked = loop.policy if isinstance(loop, RateLoop) else check_policy(policy)
    unknown = sorted(set(options) - set(CALL_OPTIONS))
    if unknown:
        raise TypeError(f"unknown rateloop option(s) {', '.join(unknown)}; "
                        f"allowed: {', '.join(CALL_OPTIONS)}")
    spec = call_spec(checked, system_clock, route, options)  # raises with the reason
    for flag, value in (("idempotent", idempotent), ("marked", marked)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be True or False, got {value!r}")
    for name, hook in (("outcome_check", outcome_check), ("on_outcome", on_outcome)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be a callable or None, got {type(hook).__name__}")
    if write_keys is not None and not isinstance(write_keys, str | WriteKeys):
        raise TypeError(f"write_keys must be a Redis URL or a WriteKeys, got {write_keys!r}")
    if not idempotent and write_keys is None:
        backend = checked.admission.backend
        if url_scheme(backend) not in ("redis", "rediss", "unix"):
            raise ValueError(
                "a write task (idempotent=False) records its keys in Redis: pass "
                f"write_keys='redis://host:port/db' (the policy's admission backend is {backend!r})"
            )
        write_keys = backend
    return Settings(checked, spec.route, MappingProxyType(dict(options)),
                     write_keys if not idempotent else None,
                     outcome_check,  # type: ignore[arg-type]  # checked callable above
                     on_outcome,  # type: ignore[arg-type]
                     marked is True)
