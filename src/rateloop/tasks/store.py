"""The task store protocol and :func:`open_store`, the factory over store URLs.

Allowed URLs:

- ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``
  (``?synchronous=full`` to make each commit survive a power loss, not only a
  process crash);
- ``postgresql://user[:password]@host[:port]/database[?schema=name]``
  (``postgres://`` too).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rateloop._clock import Clock
from rateloop._redact import redact_url
from rateloop._url import url_scheme
from rateloop.errors import ConfigError
from rateloop.tasks.deliveries import Delivery
from rateloop.tasks.model import TaskRecord
from rateloop.tasks.presence import WorkerPresence
from rateloop.tasks.queue import QueuePolicy
from rateloop.tasks.states import TaskState

__all__ = ["ALLOWED_URLS", "TaskStore", "check_store_url", "open_store"]

ALLOWED_URLS = (
    "sqlite:///path/to/tasks.db (relative) or sqlite:////abs/path/tasks.db, "
    "postgresql://user@host:5432/database[?schema=name]"
)

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@runtime_checkable
class TaskStore(Protocol):
    """What the runner and the CLI need from a store; every store passes one conformance suite."""

    def submit(self, rec: TaskRecord, policy: QueuePolicy) -> TaskRecord: ...
    def claim(
        self, worker_id: str, *, lease_secs: float, names: Collection[str] | None = None
    ) -> TaskRecord | None: ...
    def heartbeat(self, task_id: str, fence: int, *, lease_secs: float) -> bool: ...
    def save(self, rec: TaskRecord, *, fence: int) -> bool: ...
    def get(self, task_id: str) -> TaskRecord | None: ...
    def list_tasks(
        self, *, states: Sequence[TaskState] | None = None, limit: int = 100
    ) -> list[TaskRecord]: ...
    def counts(self) -> dict[TaskState, int]: ...
    def retry(
        self, task_id: str, *, budget: int = 20, accept_version: str | None = None
    ) -> TaskRecord: ...
    def cancel(self, task_id: str) -> TaskRecord: ...
    def deliveries(self, task_id: str) -> list[Delivery]: ...
    def announce_worker(
        self, worker_id: str, tasks: Collection[str], *, ttl_secs: float
    ) -> None: ...
    def retire_worker(self, worker_id: str) -> None: ...
    def live_workers(self) -> list[WorkerPresence]: ...
    def close(self) -> None: ...


def _bad(url: str, why: str) -> ConfigError:
    return ConfigError(
        f"task store URL {redact_url(url)!r} {why}", key="store", value=redact_url(url),
        allowed=ALLOWED_URLS,
    )


def _parse(url: str) -> tuple[str, str, dict[str, str]]:
    """``(engine, path or DSN, options)`` of a store URL, or a ConfigError naming it."""
    if not isinstance(url, str) or "://" not in url:
        raise _bad(str(url), "is not a URL")
    parts, scheme = urlsplit(url), url_scheme(url)
    query = dict(parse_qsl(parts.query))
    if scheme == "sqlite":
        if parts.netloc:
            raise _bad(url, "names a host; SQLite URLs have three slashes: sqlite:///path")
        path = parts.path[1:]
        if not path:
            raise _bad(url, "names no file")
        unknown = set(query) - {"synchronous"}
        if unknown:
            raise _bad(url, f"has unknown option(s) {sorted(unknown)}; SQLite allows synchronous")
        sync = query.get("synchronous", "normal")
        if sync not in ("full", "normal"):
            raise _bad(url, f"has synchronous={sync!r}; allowed: full, normal")
        return "sqlite", path, {"synchronous": sync}
    if scheme in ("postgresql", "postgres"):
        schema = query.pop("schema", "rateloop")
        if not _SCHEMA.match(schema):
            raise _bad(
                url, f"has schema={schema!r}: a lower-case SQL identifier ([a-z_][a-z0-9_]*)"
            )
        dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(query), ""))
        return "postgres", dsn, {"schema": schema}
    raise _bad(url, f"has an unsupported scheme {scheme!r}")


def check_store_url(url: str) -> None:
    """Raise :class:`~rateloop.ConfigError` for a URL :func:`open_store` cannot open; no I/O."""
    _parse(url)


def open_store(url: str, *, clock: Clock | None = None) -> TaskStore:
    """Open (and migrate) the store a URL names.

    >>> try:
    ...     open_store("redis://127.0.0.1:6379/0")
    ... except ValueError as exc:
    ...     print(str(exc).split(" (allowed")[0])
    store: task store URL 'redis://127.0.0.1:6379/0' has an unsupported scheme 'redis'
    """
    engine, target, options = _parse(url)
    if engine == "sqlite":
        from rateloop.tasks.sqlite_store import SQLiteTaskStore

        return SQLiteTaskStore(target, clock=clock, synchronous=options["synchronous"])
    from rateloop.tasks.postgres_store import PostgresTaskStore

    return PostgresTaskStore(target, schema=options["schema"], clock=clock)
