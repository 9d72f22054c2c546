"""URL schemes are case-insensitive (RFC 3986 §3.1) wherever rateloop reads one.

``rateloop._url.url_scheme`` is the one comparison; these tests go through
each door that takes a URL: the policy's backend, the admission backend
registry (memory and a real Redis), task store URLs (a real SQLite file and
a real PostgreSQL schema), and ``rateloop status`` (its ``--redis`` flag and
the policy's backend).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rateloop._url import lower_scheme, url_scheme
from rateloop.admission import LimitSpec
from rateloop.admission.backends import MemoryBackend, backend_from_url
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Denied, Reservation
from rateloop.errors import BackendError, ConfigError
from rateloop.observe.queue_state import open_store_readonly
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.tasks.store import check_store_url, open_store
from rateloop.testing import FakeClock

SRC = str(Path(__file__).resolve().parents[1] / "src")
ROUTE = Route(provider="openai", model="gpt-5", project="schemes")


def shout(url: str) -> str:
    """``redis://h`` → ``REDIS://h``: the scheme in upper case, the rest as it was."""
    scheme = url_scheme(url)
    return scheme.upper() + url[len(scheme) :]


def rateloop(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rateloop", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("REDIS://127.0.0.1:6379/0", "redis"),
        ("Rediss+Cluster://h:7000", "rediss+cluster"),
        ("SQLite:///tasks.db", "sqlite"),
        ("postgresql://u@h/db", "postgresql"),
        ("127.0.0.1:6379", ""),
        ("", ""),
        ("://h", ""),
        ("1redis://h", ""),
    ],
)
def test_url_scheme_is_the_lower_case_scheme_or_empty(url: str, scheme: str) -> None:
    assert url_scheme(url) == scheme
    assert lower_scheme(url) == (scheme + url[len(scheme) :] if scheme else url)


def test_url_scheme_of_something_that_is_not_a_string_is_empty() -> None:
    assert url_scheme(None) == "" and url_scheme(b"redis://h") == ""


# -- the policy ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "REDIS://127.0.0.1:6379/0",
        "Rediss://127.0.0.1:6380/0",
        "MEMORY://",
        "Redis+Cluster://127.0.0.1:7000",
        "UNIX:///tmp/redis.sock",
    ],
)
def test_the_policy_takes_a_backend_url_whatever_the_case_of_its_scheme(url: str) -> None:
    assert Policy.from_dict({"admission": {"backend": url}}).admission.backend == url


@pytest.mark.parametrize("url", ["127.0.0.1:6379", "REDIS:/h", "REDIS://h:0", ""])
def test_the_policy_still_refuses_a_url_without_a_scheme_or_port(url: str) -> None:
    with pytest.raises(ConfigError, match=r"admission\.backend"):
        Policy.from_dict({"admission": {"backend": url}})


# -- admission backends --------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["MEMORY://", "Memory://"])
def test_the_backend_registry_reads_the_scheme_in_any_case(url: str) -> None:
    assert isinstance(backend_from_url(url, clock=FakeClock(), prefix="p:"), MemoryBackend)


@pytest.mark.redis
def test_a_policy_with_an_upper_case_redis_url_shares_capacity_with_a_lower_case_one(
    redis_url: str, redis_prefix: str
) -> None:
    limits = {ROUTE.scope: {"concurrency": 1}}
    policy = Policy.from_dict({"admission": {"backend": shout(redis_url)}, "limits": limits})
    first = Limiter.from_policy(policy, prefix=redis_prefix)
    second = Limiter.from_url(
        redis_url, prefix=redis_prefix, limits={ROUTE.scope: LimitSpec(concurrency=1)}
    )
    try:
        held = first.try_reserve(ROUTE, Cost())
        assert isinstance(held, Reservation)
        assert isinstance(second.try_reserve(ROUTE, Cost()), Denied)  # one slot, one server
        held.release()
    finally:
        first.close()
        second.close()


# -- task stores ---------------------------------------------------------------------------------


def test_a_sqlite_store_url_in_any_case_opens_the_file(tmp_path: Path) -> None:
    url = f"SQLite:///{tmp_path}/tasks.db"
    check_store_url(url)
    store = open_store(url)
    store.close()
    assert (tmp_path / "tasks.db").exists()
    with pytest.raises(BackendError, match="no task store at"):
        open_store_readonly(f"SQLITE:///{tmp_path}/missing.db")
    assert not (tmp_path / "missing.db").exists()


@pytest.mark.postgres
def test_a_postgres_store_url_in_any_case_opens_the_database(postgres_dsn: str) -> None:
    from rateloop.tasks.postgres_store import PostgresTaskStore

    schema = f"rateloop_test_{uuid.uuid4().hex[:10]}"
    store = open_store(f"{shout(postgres_dsn)}?schema={schema}")
    try:
        assert isinstance(store, PostgresTaskStore)
    finally:
        store.close()
        cleaner = PostgresTaskStore(postgres_dsn, schema=schema)
        cleaner.drop()
        cleaner.close()


# -- rateloop status -----------------------------------------------------------------------------


@pytest.mark.redis
def test_status_takes_an_upper_case_redis_flag(redis_url: str, redis_prefix: str) -> None:
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix)
    try:
        limiter.pause(ROUTE.scope, 20.0, "overload")
    finally:
        limiter.close()
    out = rateloop("status", "--redis", shout(redis_url), "--prefix", redis_prefix, "--json")
    assert out.returncode == 0, out.stderr
    assert '"pause_reason": "overload"' in out.stdout


def test_status_uses_the_policy_backend_whatever_the_case_of_its_scheme(tmp_path: Path) -> None:
    # Nothing listens on port 1: status must try the policy's backend, not fall back to
    # its default redis://127.0.0.1:6379/0 because the scheme was not spelt in lower case.
    path = tmp_path / "policy.toml"
    path.write_text('[admission]\nbackend = "REDIS://:pw-secret@127.0.0.1:1/0"\n')
    out = rateloop("status", "-c", str(path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "127.0.0.1:1" in out.stderr and "pw-secret" not in out.stderr + out.stdout


# -- one comparison ------------------------------------------------------------------------------

# Ways a scheme was compared case-sensitively before (observe/cli.py split the URL at "://";
# tasks/store.py and observe/queue_state.py compared urlsplit(url).scheme; the policy matched
# a lower-case pattern).
_BY_HAND = re.compile(
    r"""\.scheme\s*(==|!=|in\b)"""
    r"""|(split|partition)\(\s*["']://"""
    r"""|startswith\(\s*\(?\s*f?["'](redis|rediss|unix|memory|sqlite|postgres(ql)?)\b"""
    r"""|\[a-z\]\[a-z0-9\+\.\\-\]\*://"""
)


def test_no_module_compares_a_url_scheme_but_through_url_scheme() -> None:
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in sorted(Path(SRC, "rateloop").rglob("*.py"))
        if path.name != "_url.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _BY_HAND.search(line)
    ]
    assert found == [], "compare schemes with rateloop._url.url_scheme:\n" + "\n".join(found)
