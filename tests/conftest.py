"""Shared fixtures.

Redis, PostgreSQL and RabbitMQ tests use the real servers on 127.0.0.1.  When a server
is not reachable the test is skipped, unless ``RATELOOP_REQUIRE_SERVICES=1``
(set by ``.ci/run``), in which case it fails: services are optional for
users but required in CI.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from rateloop.testing import FakeClock

#: Worker apps the tests start in subprocesses (`rateloop worker --app`): they read their
#: settings from the environment when imported, so they are not collected here.
collect_ignore = ["_batch_app.py"]

REDIS_URL = os.environ.get("RATELOOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RABBITMQ_URL = os.environ.get("RATELOOP_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
POSTGRES_DSN = os.environ.get("RATELOOP_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def _services_required() -> bool:
    return os.environ.get("RATELOOP_REQUIRE_SERVICES", "") not in ("", "0", "false")


def _unavailable(what: str, exc: BaseException) -> None:
    message = f"{what} not reachable: {exc!r}"
    if _services_required():
        pytest.fail(f"{message} (RATELOOP_REQUIRE_SERVICES is set: services are required)")
    pytest.skip(message)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def redis_url() -> str:
    """The URL of a reachable Redis, or skip (fail in CI)."""
    try:
        import redis
    except ImportError as exc:
        _unavailable("redis-py", exc)
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:
        _unavailable(f"Redis at {REDIS_URL}", exc)
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; every key under it is deleted after the test."""
    import redis

    prefix = f"rateloop-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def postgres_dsn() -> str:
    """The DSN of a reachable PostgreSQL, or skip (fail in CI)."""
    try:
        import psycopg
    except ImportError as exc:
        _unavailable("psycopg", exc)
    try:
        with psycopg.connect(POSTGRES_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        _unavailable(f"PostgreSQL at {POSTGRES_DSN}", exc)
    return POSTGRES_DSN


@pytest.fixture
def rabbitmq_url() -> str:
    """The URL of a reachable RabbitMQ (the Celery tests' broker), or skip (fail in CI)."""
    try:
        import kombu
    except ImportError as exc:
        _unavailable("kombu", exc)
    try:
        with kombu.Connection(RABBITMQ_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        _unavailable(f"RabbitMQ at {RABBITMQ_URL}", exc)
    return RABBITMQ_URL
