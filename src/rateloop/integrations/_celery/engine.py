"""The Celery side: the worker settings rateloop pairs with, and an engine that is not running.

Celery, left alone, retries a broker it cannot reach for a long time: a worker started
with the broker down retries connecting (up to 100 times, with growing pauses), and
every publish retries before it fails.  :func:`check_engine` answers at once instead,
with one :class:`~rateloop.errors.BackendError` that names the broker (or the result
backend's Redis) and what to start; :func:`configure` pairs an app with the settings the
integration needs and runs that check when a worker starts (``worker_init``), so a worker
with its broker down exits with that one message instead of retrying.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rateloop._redact import redact_url
from rateloop._url import url_scheme
from rateloop.errors import BackendError

try:
    import redis
    from celery.signals import worker_init  # type: ignore[import-untyped]
    from kombu.exceptions import OperationalError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "rateloop.integrations.celery needs celery: pip install 'rateloop[celery]'"
    ) from exc

__all__ = [
    "WORKER_SETTINGS",
    "BrokerUnreachable",
    "check_engine",
    "configure",
    "how_to_start",
    "unreachable_broker",
]

#: The settings :func:`configure` applies; each is why the integration holds:
WORKER_SETTINGS: Mapping[str, Any] = {
    # A message is acknowledged after the task returned, never before: a worker killed
    # mid-task leaves it to the broker, which delivers it again.
    "task_acks_late": True,
    # ... also when the pool's child process was killed (SIGKILL, the OOM killer).
    "task_reject_on_worker_lost": True,
    # A worker reserves one message per free slot: a task waiting for a reset goes back to
    # the broker as a retry countdown instead of sitting in a worker's prefetch.
    "worker_prefetch_multiplier": 1,
    # A publish to a broker that is down fails within about a second, not a minute.
    "task_publish_retry_policy": {
        "max_retries": 2, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 0.5,
    },
    "broker_connection_timeout": 3.0,
    "redis_socket_connect_timeout": 3.0,
    # Celery asks for this one to be set (its default changes); worker_init checks first.
    "broker_connection_retry_on_startup": True,
}


class BrokerUnreachable(BackendError):
    """The Celery broker or result backend cannot be reached; the message says what to start."""


def how_to_start(url: str) -> str:
    """What to start for a broker or backend URL (its scheme names the server)."""
    scheme = url_scheme(url)
    if scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        return "start RabbitMQ (e.g. `rabbitmq-server` or `docker run -d -p 5672:5672 rabbitmq:3`)"
    if scheme in ("redis", "rediss", "sentinel"):
        return "start Redis (e.g. `redis-server` or `docker run -d -p 6379:6379 redis:7`)"
    return "start the server it names"


def unreachable_broker(app: Any, exc: BaseException) -> BrokerUnreachable:
    """The one error for a broker ``app`` cannot reach (``exc``: kombu's or a socket's)."""
    url = app.connection_for_write().as_uri()  # the password is masked
    return BrokerUnreachable(
        f"the Celery broker at {redact_url(url)} cannot be reached ({exc}): "
        f"{how_to_start(url)}, or point the app's broker_url at a running one"
    )


def check_engine(app: Any, *, timeout: float = 3.0) -> None:
    """Raise :class:`BrokerUnreachable` unless ``app``'s broker (and its Redis result
    backend, if it has one) answer within ``timeout`` seconds each."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    conn = app.connection_for_write(connect_timeout=timeout)
    try:
        conn.ensure_connection(max_retries=1, timeout=timeout)
    except (OperationalError, OSError) as exc:
        raise unreachable_broker(app, exc) from exc
    finally:
        conn.release()
    backend = app.conf.result_backend
    if isinstance(backend, str) and url_scheme(backend) in ("redis", "rediss"):
        client = redis.Redis.from_url(
            backend, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        try:
            client.ping()
        except redis.RedisError as exc:
            raise BrokerUnreachable(
                f"the Celery result backend at {redact_url(backend)} cannot be reached "
                f"({exc}): {how_to_start(backend)}, or point result_backend at a running one"
            ) from exc
        finally:
            client.close()


def configure(app: Any, *, check_on_start: bool = True) -> Any:
    """Apply :data:`WORKER_SETTINGS` to ``app`` and, with ``check_on_start``, make each of
    its workers run :func:`check_engine` as it starts: a worker whose broker is down exits
    with one message naming what to start.  Returns ``app``."""
    app.conf.update(dict(WORKER_SETTINGS))
    if check_on_start:

        def check(sender: Any = None, **_: Any) -> None:
            worker_app = getattr(sender, "app", None)
            if worker_app is not app:
                return  # another app's worker in this process
            try:
                check_engine(app)
            except BrokerUnreachable as exc:
                # A signal handler's exception is only logged; SystemExit ends the worker.
                raise SystemExit(f"rateloop: {exc}") from exc

        worker_init.connect(check, weak=False)
    return app
