"""Backend selection, failure modes, round trips and key hygiene."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from _redis_server import redis_server
from rateloop.admission.backends import BackendUnreachable, registered_schemes
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.backends.redis import RedisBackend, redact_url
from rateloop.admission.limiter import LOCAL_RETRY_SECONDS, Limiter
from rateloop.admission.reservation import Reservation
from rateloop.admission.spec import LimitSpec
from rateloop.errors import BackendError, ConfigError
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock


def minute_spec(**fields: Any) -> LimitSpec:
    """A LimitSpec holding a whole minute (``burst = 1``), refunding unused output.

    These tests check the arithmetic; the default pacing (one second of the
    rate) and the providers' accounting profiles have their own tests.
    """
    return LimitSpec(**{"burst": 1.0, "profile": "generic", **fields})


ROUTE = Route(provider="openai", model="gpt-5", project="proj-1")
LIMITS = {"openai:gpt-5": minute_spec(requests_per_minute=10, concurrency=4)}
NOWHERE = "redis://:s3cret@127.0.0.1:1/0"  # nothing listens on port 1


def test_from_url_picks_the_backend_by_scheme() -> None:
    assert isinstance(Limiter.from_url("memory://").backend, MemoryBackend)
    assert isinstance(Limiter.from_url("redis://127.0.0.1:6379/0").backend, RedisBackend)
    assert {"memory", "redis", "rediss", "unix"} <= set(registered_schemes())
    with pytest.raises(ConfigError, match=r"mongodb://x.*allowed: memory://"):
        Limiter.from_url("mongodb://x")


def test_bad_limiter_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="on_unreachable"):
        Limiter(on_unreachable="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="local_share"):
        Limiter(local_share=1.5)
    with pytest.raises(TypeError, match="LimitSpec"):
        Limiter(limits={"a": {"requests_per_minute": 1}})  # type: ignore[dict-item]


def test_redact_url_hides_the_password() -> None:
    assert redact_url("redis://user:pw@host:6380/1") == "redis://user:***@host:6380/1"
    assert redact_url("redis://host/0") == "redis://host/0"


def test_unreachable_redis_fails_closed_naming_the_url_without_password() -> None:
    limiter = Limiter.from_url(NOWHERE, limits=LIMITS, socket_timeout=0.2)
    with pytest.raises(BackendError) as info:
        limiter.try_reserve(ROUTE, Cost())
    text = str(info.value)
    assert "127.0.0.1:1" in text
    assert "s3cret" not in text
    assert "redis-server" in text
    assert isinstance(info.value, BackendUnreachable)
    assert isinstance(info.value.__cause__, redis.ConnectionError)

    async def main() -> None:
        with pytest.raises(BackendError, match="unreachable"):
            await limiter.atry_reserve(ROUTE, Cost())
        await limiter.aclose()

    asyncio.run(main())


def test_unreachable_redis_falls_back_to_a_local_share() -> None:
    clock = FakeClock()
    limiter = Limiter.from_url(
        NOWHERE,
        limits=LIMITS,
        clock=clock,
        on_unreachable="local",
        local_share=0.5,
        socket_timeout=0.2,
    )
    # The local limiter starts full: the process does not know what the others admitted
    # just before, so it goes at its share of the rate (5 a minute), not with a burst.
    first = limiter.try_reserve(ROUTE, Cost())
    assert not first and first.retry_after == pytest.approx(12.0)
    clock.advance(60.0)
    granted = []
    while isinstance(r := limiter.try_reserve(ROUTE, Cost()), Reservation):
        granted.append(r)
    assert len(granted) == 2  # concurrency 4 × 0.5 binds before 10 × 0.5 requests
    assert all(r.local for r in granted)
    granted[0].settle(0, 0)  # settles on the local limiter that granted it
    assert limiter.try_reserve(ROUTE, Cost())

    async def main() -> None:
        assert not await limiter.atry_reserve(ROUTE, Cost())
        clock.advance(LOCAL_RETRY_SECONDS + 1)  # time to try Redis again: still down
        assert not await limiter.atry_reserve(ROUTE, Cost())
        await limiter.aclose()

    asyncio.run(main())


class CountingConnection(redis.Connection):
    """A real connection that records the name of every command it writes to the socket.

    Counted where the bytes go out (``send_packed_command``), so commands the
    backend packs itself count as well as those redis-py packs.
    """

    sent: list[str] = []  # noqa: RUF012 - shared on purpose, reset by the test

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        data = b"".join(bytes(c) for c in command) if isinstance(command, list) else command
        if isinstance(data, str):
            data = data.encode()
        CountingConnection.sent.extend(_command_names(data))
        super().send_packed_command(command, check_health)


def _command_names(data: bytes) -> list[str]:
    """The name of every command in ``data`` (the Redis protocol: arrays of bulk strings)."""
    names = []
    at = 0
    while at < len(data):
        assert data[at : at + 1] == b"*", data[at : at + 20]
        end = data.index(b"\r\n", at)
        items = int(data[at + 1 : end])
        at = end + 2
        for item in range(items):
            end = data.index(b"\r\n", at)
            size = int(data[at + 1 : end])
            if item == 0:
                names.append(data[end + 2 : end + 2 + size].decode().upper())
            at = end + 2 + size + 2
    return names


COUNTED_LIMITS = {
    "openai:gpt-5": minute_spec(requests_per_minute=10_000, tokens_per_minute=10**7),
    "openai:gpt-5:proj-1": minute_spec(
        input_tokens_per_minute=10**7, requests_per_day=10**6, concurrency=500
    ),
}


@pytest.fixture
def counting_limiter(redis_url: str, redis_prefix: str) -> Iterator[Limiter]:
    limiter = Limiter.from_url(
        redis_url, prefix=redis_prefix, limits=COUNTED_LIMITS, connection_class=CountingConnection
    )
    yield limiter
    limiter.close()


def test_redis_admission_is_exactly_one_evalsha(counting_limiter: Limiter) -> None:
    # Warm-up: each script may have to be loaded once into the server's cache.
    counting_limiter.try_reserve(ROUTE, Cost()).settle(0, 0)  # type: ignore[union-attr]
    CountingConnection.sent.clear()
    held = [counting_limiter.try_reserve(ROUTE, Cost(input_tokens=10)) for _ in range(50)]
    assert CountingConnection.sent == ["EVALSHA"] * 50
    CountingConnection.sent.clear()
    for r in held:
        assert isinstance(r, Reservation)
        r.settle(5, 1)
    assert CountingConnection.sent == ["EVALSHA"] * 50


def without_handshake(sent: list[str]) -> list[str]:
    """The commands sent, minus a new connection's handshake (HELLO, CLIENT SETINFO, ...)."""
    return [c for c in sent if c not in ("HELLO", "CLIENT", "SELECT", "AUTH")]


def test_fresh_redis_loads_each_script_once_then_one_evalsha() -> None:
    """On a server whose script cache is empty (a freshly started one, started here)."""
    with redis_server() as port:
        limiter = Limiter.from_url(
            f"redis://127.0.0.1:{port}/0",
            limits=COUNTED_LIMITS,
            connection_class=CountingConnection,
            socket_timeout=5.0,
        )
        try:
            CountingConnection.sent.clear()
            first = limiter.try_reserve(ROUTE, Cost(input_tokens=10))
            assert isinstance(first, Reservation)
            # The connection's handshake, then: not in the cache yet, so one EVALSHA
            # fails with NOSCRIPT and the script goes once with EVAL (which caches it).
            assert without_handshake(CountingConnection.sent) == ["EVALSHA", "EVAL"]
            CountingConnection.sent.clear()
            held = [limiter.try_reserve(ROUTE, Cost(input_tokens=10)) for _ in range(20)]
            assert CountingConnection.sent == ["EVALSHA"] * 20
            CountingConnection.sent.clear()
            first.settle(5, 1)  # the settle script is loaded on its first use
            assert CountingConnection.sent == ["EVALSHA", "EVAL"]
            CountingConnection.sent.clear()
            for r in held:
                assert isinstance(r, Reservation)
                r.settle(5, 1)
            assert CountingConnection.sent == ["EVALSHA"] * 20
        finally:
            limiter.close()


def test_redis_keys_are_prefixed_and_expire(redis_url: str, redis_prefix: str) -> None:
    limiter = Limiter.from_url(
        redis_url,
        prefix=redis_prefix,
        limits={"openai:gpt-5": minute_spec(requests_per_minute=60, concurrency=2)},
    )
    r = limiter.try_reserve(ROUTE, Cost())
    assert isinstance(r, Reservation)
    limiter.pause("openai:gpt-5:proj-1", 5.0, "test")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        tag = f"{redis_prefix}{{openai:gpt-5}}"  # every key of the route in one cluster slot
        found = sorted(client.scan_iter(match=f"{redis_prefix}*"))
        # The history, a hash per hour: the admission's scope and the paused one, each
        # expiring a day after its hour ends (rateloop.admission.history).
        history = [k for k in found if k.startswith(f"{tag}:h:")]
        assert {k.rsplit(":", 1)[0] for k in history} == {
            f"{tag}:h:openai:gpt-5",
            f"{tag}:h:openai:gpt-5:proj-1",
        }
        assert all(86_400_000 - 5_000 < client.pttl(k) <= (86_400 + 3_600) * 1_000 for k in history)
        keys = [k for k in found if k not in history]
        assert keys == [
            f"{tag}:l:openai:gpt-5",
            f"{tag}:s:openai:gpt-5",
            f"{tag}:s:openai:gpt-5:proj-1",  # the paused scope: the pause is in its state
        ]
        ttls = [client.pttl(k) for k in keys]
        # One request drains in 1 s; the TTL is set with a minute of slack (so most
        # admissions need no PEXPIRE), the lease set to the lease TTL, the pause to its end.
        assert 0 < ttls[1] <= (1 + 1 + 60) * 1_000 + 1
        assert 0 < ttls[0] <= 600_000 + 1_000
        assert 5_000 < ttls[2] <= (5 + 1 + 60) * 1_000 + 1
    finally:
        client.close()
        limiter.close()


class SwitchableProxy:
    """A real TCP proxy on loopback in front of Redis that can be switched off and on.

    Switched off, it closes every connection and its port refuses new ones: to
    the limiter, Redis is unreachable -- without touching the shared server.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def on(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen()
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def off(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
            self._server.close()
            self._server = None
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxy(redis_url: str) -> Iterator[SwitchableProxy]:
    parts = urlsplit(redis_url)
    p = SwitchableProxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    p.on()
    yield p
    p.off()


def test_shared_reservation_settles_on_redis_during_the_local_window(
    proxy: SwitchableProxy, redis_url: str, redis_prefix: str
) -> None:
    limits = {"openai:gpt-5": minute_spec(concurrency=2, output_tokens_per_minute=1_000)}
    limiter = Limiter.from_url(
        f"redis://127.0.0.1:{proxy.port}/{urlsplit(redis_url).path.strip('/') or 0}",
        prefix=redis_prefix,
        limits=limits,
        on_unreachable="local",
        socket_timeout=1.0,
    )
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    tag = f"{redis_prefix}{{openai:gpt-5}}"
    leases, state = f"{tag}:l:openai:gpt-5", f"{tag}:s:openai:gpt-5"
    try:
        shared = [limiter.try_reserve(ROUTE, Cost(output_tokens=400)) for _ in range(2)]
        assert all(isinstance(r, Reservation) and not r.local for r in shared)
        assert client.zcard(leases) == 2
        proxy.off()
        fallback = limiter.try_reserve(ROUTE, Cost())  # unreachable: the local window starts
        assert isinstance(fallback, Reservation) and fallback.local
        # Still unreachable: the settle is dropped (not applied to the local limiter);
        # its lease stays in Redis until its TTL.
        first, second = shared
        assert isinstance(first, Reservation) and isinstance(second, Reservation)
        first.settle(0, 0)
        assert first.settled_at is None
        proxy.on()
        # Reachable again, still inside the local window: the settle goes to Redis.
        second.settle(0, 100)
        assert second.settled_at is not None
        assert client.zrange(leases, 0, -1) == [first.lease_id]
        level = float(client.hget(state, "output_tokens:l") or 0)
        assert level <= 800 - 300 + 1e-6  # 300 unused output tokens were refunded
        fallback.settle(0, 0)
    finally:
        client.close()
        limiter.close()


def test_async_clients_of_many_loops_in_many_threads(redis_url: str) -> None:
    """Loops in other threads create and prune clients at once: no 'changed size' error."""
    backend = RedisBackend(redis_url)
    errors: list[BaseException] = []

    async def touch() -> None:
        backend.clients.async_client()  # builds this loop's client (lazily), prunes dead ones

    def run() -> None:
        try:
            for _ in range(150):
                asyncio.run(touch())  # each loop is closed afterwards: a dead entry to prune
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: make the race likely
    try:
        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []


def test_redis_lease_expires_at_granted_at_plus_ttl_and_expired_leases_free_the_slot(
    redis_url: str, redis_prefix: str
) -> None:
    spec = minute_spec(concurrency=1, lease_ttl_secs=37)
    limiter = Limiter.from_url(redis_url, prefix=redis_prefix, limits={"openai:gpt-5": spec})
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    leases = f"{redis_prefix}{{openai:gpt-5}}:l:openai:gpt-5"
    try:
        r = limiter.try_reserve(ROUTE, Cost())
        assert isinstance(r, Reservation) and r.lease_id is not None
        assert client.zscore(leases, r.lease_id) == pytest.approx(r.granted_at + 37, abs=1e-6)
        assert not limiter.try_reserve(ROUTE, Cost())  # the one slot is held
        r.release()
        # A lease left by a crashed holder, already past its expiry, holds nothing ...
        seconds, micros = client.time()
        server_now = seconds + micros / 1e6
        client.zadd(leases, {"crashed-holder": server_now - 1.0})
        fresh = limiter.try_reserve(ROUTE, Cost())
        assert isinstance(fresh, Reservation)
        assert client.zscore(leases, "crashed-holder") is None  # and it was swept
        fresh.release()
        # ... while one that has not expired yet does.
        client.zadd(leases, {"live-holder": server_now + 30.0})
        assert not limiter.try_reserve(ROUTE, Cost())
    finally:
        client.close()
        limiter.close()
