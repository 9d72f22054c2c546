"""The live scope state: the sans-IO arithmetic, the Redis reader, and ``rateloop status``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rateloop.admission import LimitSpec
from rateloop.admission.gcra import AIMD
from rateloop.admission.limiter import Limiter
from rateloop.admission.reservation import Reservation
from rateloop.errors import BackendError
from rateloop.observe.redis_state import RedisStateReader, key_of, scope_of_key
from rateloop.observe.state import RawScope, scope_state
from rateloop.route import Cost, Route
from rateloop.signal import Kind, LimitSignal

SCOPE = "openai:gpt-5:proj"
ROUTE = Route(provider="openai", model="gpt-5", project="proj")
SPEC = LimitSpec(
    requests_per_minute=60,
    input_tokens_per_minute=10_000,
    requests_per_day=1000,
    concurrency=4,
    burst=1.0,  # a minute's allowance at once: the tests fill it without waiting
)
POLICY = f"""
[limits."{SCOPE}"]
requests_per_minute = 60
input_tokens_per_minute = 10000
requests_per_day = 1000
concurrency = 4
burst = 1.0
"""
SRC = str(Path(__file__).resolve().parents[1] / "src")


# --- the arithmetic, sans-IO -------------------------------------------------------------


def test_a_bucket_drains_between_its_write_and_the_read() -> None:
    now = 1_000_000.0
    raw = RawScope(SCOPE, {"requests:l": "30", "requests:t": repr(now - 10)})
    (req, *_) = scope_state(raw, LimitSpec(requests_per_minute=60, burst=1.0), now).dimensions
    # 30 requests in the bucket 10 s ago, draining at 1/s: 20 left, 40 of 60 free.
    assert (req.dimension, req.used, req.headroom, req.capacity) == ("requests", 20.0, 40.0, 60.0)
    assert req.headroom_fraction == pytest.approx(2 / 3)


def test_a_lowered_aimd_factor_scales_the_effective_limit_and_recovers() -> None:
    now = 1_000_000.0
    raw = RawScope(SCOPE, {"f": "0.5", "fs": repr(now - 60)})
    aimd = AIMD(recover_per_minute=0.1)
    state = scope_state(raw, LimitSpec(requests_per_minute=100), now, aimd=aimd)
    # 0.5 set a minute ago, recovering 0.1 per minute: 0.6 now.
    assert state.factor == pytest.approx(0.6)
    assert state.dimensions[0].effective == pytest.approx(60.0)
    assert state.dimensions[0].configured == 100


def test_a_day_count_of_a_past_window_is_zero_and_the_reset_is_named() -> None:
    now = datetime(2026, 3, 1, 18, 0, tzinfo=UTC).timestamp()
    yesterday = str((now - 86_400) // 86_400)
    spec = LimitSpec(requests_per_day=100)
    old = scope_state(
        RawScope(SCOPE, {"requests_per_day:c": "99", "requests_per_day:w": yesterday}), spec, now
    )
    today = str(now // 86_400)
    new = scope_state(
        RawScope(SCOPE, {"requests_per_day:c": "99", "requests_per_day:w": today}), spec, now
    )
    assert old.dimensions[0].used == 0 and new.dimensions[0].used == 99
    assert new.dimensions[0].resets_at == datetime(2026, 3, 2, tzinfo=UTC)


def test_a_provider_block_leaves_no_headroom_and_a_pause_is_parsed() -> None:
    now = 1_000_000.0
    raw = RawScope(SCOPE, {"requests:b": repr(now + 30)}, pause=f"{now + 12!r}|temporary")
    state = scope_state(raw, LimitSpec(requests_per_minute=60), now)
    assert state.dimensions[0].headroom == 0
    assert state.dimensions[0].blocked_until == datetime.fromtimestamp(now + 30, tz=UTC)
    assert state.paused and state.pause_reason == "temporary"
    assert state.paused_until == datetime.fromtimestamp(now + 12, tz=UTC)
    expired = scope_state(RawScope(SCOPE, pause=f"{now - 1!r}|x"), None, now)
    assert not expired.paused and expired.dimensions == ()


def test_scope_of_key_reads_only_keys_under_the_prefix() -> None:
    assert scope_of_key("p:", "p:{openai:gpt-5}:s:openai:gpt-5") == ("s", "openai:gpt-5")
    assert scope_of_key("p:", "p:{a:b}:k:a:b:c:d") == ("k", "a:b:c:d")
    assert scope_of_key("p:", "q:{openai:gpt-5}:s:openai:gpt-5") is None
    assert scope_of_key("p:", "p:{openai:gpt-5}:x:openai:gpt-5") is None
    assert scope_of_key("p:", "p:{openai:gpt-5}:s:") is None
    assert scope_of_key("p:", "p:{openai:o3}:s:openai:gpt-5") is None  # not its own tag
    assert scope_of_key("p:", "p:events") is None


@pytest.mark.parametrize("scope", ["openai:gpt-5", "openai:gpt-5:proj", "a:b:c:tenant-7", "x:y"])
def test_key_of_names_keys_as_the_redis_backend_does(scope: str) -> None:
    from rateloop.admission.backends.redis import RedisBackend

    backend = RedisBackend("redis://127.0.0.1:1/0", prefix="pre:")  # never connects
    for kind in ("s", "l", "k"):
        assert key_of("pre:", kind, scope) == backend.codec.key(kind, scope)
    backend.close()


# --- the real Redis -------------------------------------------------------------------------


@pytest.fixture
def limiter(redis_url: str, redis_prefix: str) -> Iterator[Limiter]:
    lim = Limiter.from_url(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    yield lim
    lim.close()


@pytest.mark.redis
def test_the_reader_sees_what_a_real_limiter_admitted(
    limiter: Limiter, redis_url: str, redis_prefix: str
) -> None:
    held = [limiter.try_reserve(ROUTE, Cost(input_tokens=500)) for _ in range(3)]
    assert all(isinstance(r, Reservation) for r in held)
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    try:
        snap = reader.read()
    finally:
        reader.close()
    state = snap.scope(SCOPE)
    assert state is not None and not state.paused and state.factor == 1.0
    dims = {d.dimension: d for d in state.dimensions}
    assert dims["requests"].used == pytest.approx(3.0, abs=0.2)  # drains 1/s meanwhile
    assert dims["input_tokens"].used == pytest.approx(1500.0, abs=200)
    assert dims["requests_per_day"].used == 3.0
    assert (dims["concurrency"].used, dims["concurrency"].headroom) == (3.0, 1.0)
    assert abs((snap.at - datetime.now(UTC)).total_seconds()) < 5  # the server's clock


@pytest.mark.redis
def test_the_reader_sees_pauses_and_a_lowered_factor_and_writes_nothing(
    limiter: Limiter, redis_url: str, redis_prefix: str
) -> None:
    import redis

    limiter.pause(SCOPE, 30.0, "temporary")
    limiter.observe(SCOPE, LimitSignal.of(Kind.TEMPORARY, retry_after=30.0))
    client = redis.Redis.from_url(redis_url)
    keys = sorted(client.scan_iter(match=f"{redis_prefix}*"))
    before = {k: client.dump(k) for k in keys}
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    try:
        state = reader.read().scope(SCOPE)
    finally:
        reader.close()
    assert state is not None and state.paused and state.pause_reason == "temporary"
    assert state.paused_until is not None
    assert 25 < (state.paused_until - datetime.now(UTC)).total_seconds() <= 31
    assert state.factor == pytest.approx(0.8, abs=0.01)
    assert state.dimensions[0].effective == pytest.approx(48.0, abs=0.5)
    assert sorted(client.scan_iter(match=f"{redis_prefix}*")) == keys
    assert {k: client.dump(k) for k in keys} == before
    client.close()


@pytest.mark.redis
def test_an_unconfigured_scope_with_state_is_listed(redis_url: str, redis_prefix: str) -> None:
    other = Limiter.from_url(redis_url, prefix=redis_prefix)
    other.pause("anthropic:claude", 10.0, "overload")
    other.close()
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    try:
        snap = reader.read()
    finally:
        reader.close()
    assert [s.scope for s in snap.scopes] == ["anthropic:claude", SCOPE]
    claude = snap.scopes[0]
    assert claude.paused and not claude.configured and claude.dimensions == ()


def test_an_unreachable_redis_is_a_backend_error_naming_it() -> None:
    reader = RedisStateReader("redis://:hunter2@127.0.0.1:1/0", socket_timeout=1.0)
    with pytest.raises(BackendError, match=r"127\.0\.0\.1:1") as info:
        reader.read()
    assert "hunter2" not in str(info.value)
    reader.close()


# --- the command ----------------------------------------------------------------------------------


def rateloop(
    *args: str, timeout: float = 30, columns: int = 200
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "rateloop", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return path


@pytest.mark.redis
def test_status_prints_a_table_per_scope(
    limiter: Limiter, redis_url: str, redis_prefix: str, policy_file: Path
) -> None:
    limiter.try_reserve(ROUTE, Cost(input_tokens=100))
    limiter.pause(SCOPE, 60.0, "temporary")
    out = rateloop("status", "--redis", redis_url, "--prefix", redis_prefix, "-c", str(policy_file))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == [
        "SCOPE", "STATE", "WAITING", "AIMD", "DIMENSION", "LIMIT", "EFFECTIVE",
        "USED/CAPACITY", "HEADROOM", "NOTE",
    ]  # fmt: skip
    (row,) = [line for line in lines if line.startswith(SCOPE)]
    assert re.search(r"paused, (\d\d s|1 min) left \(temporary\)", row), row  # in words
    assert "requests" in row and "60/min" in row
    assert any(line.split()[:2] == ["concurrency", "4"] for line in lines[2:])


@pytest.mark.redis
def test_status_json_for_scripts(
    limiter: Limiter, redis_url: str, redis_prefix: str, policy_file: Path
) -> None:
    limiter.try_reserve(ROUTE, Cost(input_tokens=100))
    out = rateloop(
        "status", "--redis", redis_url, "--prefix", redis_prefix, "-c", str(policy_file), "--json"
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (scope,) = data["scopes"]
    assert scope["scope"] == SCOPE and scope["paused"] is False
    dims = {d["dimension"]: d for d in scope["dimensions"]}
    assert dims["requests_per_day"]["used"] == 1
    assert dims["concurrency"]["headroom"] == 3
    assert 0 < dims["requests"]["headroom_fraction"] <= 1


@pytest.mark.redis
def test_status_takes_the_redis_url_from_the_policy(
    limiter: Limiter, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    limiter.pause(SCOPE, 20.0, "overload")
    path = tmp_path / "policy.toml"
    path.write_text(f'[admission]\nbackend = "{redis_url}"\n' + POLICY)
    out = rateloop("status", "--prefix", redis_prefix, "-c", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["scopes"][0]["pause_reason"] == "overload"


@pytest.mark.redis
def test_status_watch_refreshes_until_interrupted(
    limiter: Limiter, redis_url: str, redis_prefix: str
) -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rateloop", "status", "--redis", redis_url, "--prefix",
         redis_prefix, "--watch", "--interval", "0.2", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        limiter.pause(SCOPE, 30.0, "temporary")
        for _ in range(50):  # 10 s at most
            frame = json.loads(proc.stdout.readline())
            if frame["scopes"] and frame["scopes"][0]["paused"]:
                break
        else:
            pytest.fail("status --watch never showed the pause")
        assert first["scopes"] != frame["scopes"]
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def test_status_on_an_unreachable_redis_exits_2_naming_it() -> None:
    out = rateloop("status", "--redis", "redis://:pw-secret@127.0.0.1:1/0")
    assert out.returncode == 2
    assert "127.0.0.1:1" in out.stderr and "pw-secret" not in out.stderr + out.stdout


def test_status_rejects_a_bad_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[limits."openai:gpt-5"]\nrequests_per_minute = -1\n')
    out = rateloop("status", "-c", str(path))
    assert out.returncode == 2
    assert out.stderr.startswith("rateloop: invalid policy: ")
    assert "requests_per_minute" in out.stderr and "-1" in out.stderr


# --- gauges of the state, through the real exporters -------------------------------------------


@pytest.mark.redis
def test_prometheus_gauges_of_the_live_state(
    limiter: Limiter, redis_url: str, redis_prefix: str
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rateloop.observe.state_metrics import ScopeStateCollector

    held = limiter.try_reserve(ROUTE, Cost(input_tokens=100))
    assert isinstance(held, Reservation)
    limiter.pause(SCOPE, 30.0, "temporary")
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    registry = CollectorRegistry()
    registry.register(ScopeStateCollector(reader))
    try:
        text = generate_latest(registry).decode()
    finally:
        reader.close()
    values = {
        (s.name, s.labels.get("dimension")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("rateloop_scope_paused", None)] == 1
    assert 25 < values[("rateloop_scope_pause_remaining_seconds", None)] <= 30
    assert values[("rateloop_scope_headroom", "concurrency")] == 3
    assert values[("rateloop_scope_capacity", "requests_per_day")] == 1000
    assert values[("rateloop_scope_limit_configured", "requests")] == 60
    assert values[("rateloop_scope_limit_effective", "requests")] == 60
    assert values[("rateloop_scope_aimd_factor", None)] == 1


@pytest.mark.redis
def test_otel_gauges_of_the_live_state(limiter: Limiter, redis_url: str, redis_prefix: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from rateloop.observe.state_metrics import observe_scope_state

    limiter.observe(SCOPE, LimitSignal.of(Kind.TEMPORARY, retry_after=5.0))
    reader = RedisStateReader(redis_url, prefix=redis_prefix, limits={SCOPE: SPEC})
    metric_reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[metric_reader])
    try:
        observe_scope_state(reader, meter_provider=provider)
        data = metric_reader.get_metrics_data()
    finally:
        provider.shutdown()
        reader.close()
    assert data is not None
    points = {
        (m.name, p.attributes.get("rateloop.dimension")): p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        for p in m.data.data_points
    }
    assert points[("rateloop.scope.aimd_factor", None)] == pytest.approx(0.8, abs=0.01)
    assert points[("rateloop.scope.limit_effective", "requests")] == pytest.approx(48, abs=0.5)
    assert points[("rateloop.scope.limit_configured", "requests")] == 60
    assert points[("rateloop.scope.paused", None)] == 0


@pytest.mark.redis
def test_limits_learned_from_headers_govern_a_zero_config_scope(
    redis_url: str, redis_prefix: str
) -> None:
    zero_config = Limiter.from_url(redis_url, prefix=redis_prefix)
    headers = {
        "x-ratelimit-limit-requests": "600",
        "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "100ms",
    }
    zero_config.observe(SCOPE, headers)
    zero_config.close()
    reader = RedisStateReader(redis_url, prefix=redis_prefix)  # no --config at all
    try:
        state = reader.read().scope(SCOPE)
    finally:
        reader.close()
    assert state is not None
    assert (state.governed_by, state.configured) == ("learned", False)
    assert state.learned == {"requests_per_minute": 600}
    (requests,) = state.dimensions
    assert (requests.dimension, requests.configured) == ("requests", 600)
    out = rateloop("status", "--redis", redis_url, "--prefix", redis_prefix)
    assert out.returncode == 0, out.stderr
    assert "600/min learned" in out.stdout
    from rateloop.observe.state_metrics import gauge_values

    snap = RedisStateReader(redis_url, prefix=redis_prefix)
    try:
        values = gauge_values(snap.read())
    finally:
        snap.close()
    assert values["limit_learned"] == [({"scope": SCOPE, "dimension": "requests"}, 600.0)]
    assert values["limit_configured"] == []
