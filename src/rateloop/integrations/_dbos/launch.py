"""Launching DBOS after a fast check of its system database: one clear error, not a hang."""

from __future__ import annotations

import math

import psycopg
from dbos import DBOS, DBOSConfig

from rateloop._redact import redact_url
from rateloop._url import url_scheme
from rateloop.errors import BackendError

__all__ = ["check_system_database", "launch"]


def _postgres_dsn(url: str) -> str | None:
    """The libpq form of a PostgreSQL URL (``postgresql+psycopg://`` too); None otherwise."""
    scheme = url_scheme(url)
    rest = url[len(scheme) :]
    if not rest.startswith("://") or scheme.split("+", 1)[0] not in ("postgresql", "postgres"):
        return None
    return "postgresql" + rest


def check_system_database(url: str, *, connect_timeout: float = 5.0) -> None:
    """Raise :class:`~rateloop.errors.BackendError` when PostgreSQL at ``url`` does not answer.

    A database that does not exist yet passes: DBOS creates it.  SQLite URLs pass.
    """
    dsn = _postgres_dsn(url)
    if dsn is None:
        return
    try:
        psycopg.connect(dsn, connect_timeout=max(1, math.ceil(connect_timeout))).close()
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc):
            return
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendError(
            f"the DBOS system database at {redact_url(url)} is not reachable ({first}): "
            "start PostgreSQL there, or set system_database_url to a running server"
        ) from exc


def launch(config: DBOSConfig, *, connect_timeout: float = 5.0) -> DBOS:
    """``DBOS(config=config)`` and ``DBOS.launch()``, after checking the system database.

    A PostgreSQL that does not answer is one :class:`~rateloop.errors.BackendError` naming
    the URL and what to start, within ``connect_timeout`` seconds, before DBOS starts.
    """
    url = config.get("system_database_url")
    if url is None:
        raise ValueError("config must set system_database_url (a postgresql:// URL)")
    check_system_database(url, connect_timeout=connect_timeout)
    dbos = DBOS(config=config)
    DBOS.launch()
    return dbos
