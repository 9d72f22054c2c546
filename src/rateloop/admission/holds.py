"""Held capacity: a provider limit on what is *in flight*, held until released.

How it works.  A provider's batch queue limits the input tokens of the
batches a model has enqueued (OpenAI's "enqueued token limit"): capacity is
taken when a batch is submitted and given back only when it ends, hours
later, whoever ends it.  That is neither a bucket (nothing refills with time)
nor a concurrency slot (its size is a number of tokens), so it is a
dimension of its own, ``enqueued_tokens``, configured like the others::

    [limits."openai:gpt-4o-mini:proj-1:batch"]
    enqueued_tokens = 2_000_000

A hold is named by a key the caller chooses (a batch's submission key), so
it is idempotent: holding the same key again — a worker that crashed after
holding and is redelivered — replaces its amount instead of adding to it,
and a release by any process, later, frees it.  Every hold expires after its
``ttl`` (a batch's completion window and some slack), so a task that is never
resumed cannot leak the capacity.

Where it lives: in the limiter's backend, so every process that shares the
limiter shares the holds — one hash per scope in Redis (``{prefix}{R}:q:{S}``,
a field per key, ``"amount expiry"``, one script on the server's clock), a
dict per scope in memory.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from rateloop.admission.backends.keys import HOLDS, key_of
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.backends.redis import RedisBackend
from rateloop.admission.limiter import Limiter
from rateloop.errors import BackendError

__all__ = ["Held", "HeldCapacity"]

_HOLD_LUA = """
-- KEYS[1]: the holds of one scope (field: key, value: 'amount expiry')
-- ARGV: key, amount, limit (-1: none), ttl seconds
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local all = redis.call('HGETALL', KEYS[1])
local held, mine = 0, false
for i = 1, #all, 2 do
  local a, e = string.match(all[i + 1], '^(%S+) (%S+)$')
  if tonumber(e) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] == ARGV[1] then
    mine = true
  else
    held = held + tonumber(a)
  end
end
local amount, limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if amount < 0 then return {1, tostring(held)} end
if not mine and limit >= 0 and held + amount > limit then return {0, tostring(held)} end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d %.6f', amount, now + ttl))
if redis.call('TTL', KEYS[1]) < ttl + 60 then
  redis.call('EXPIRE', KEYS[1], math.ceil(ttl) + 60)
end
return {1, tostring(held + amount)}
"""


@dataclass(frozen=True, slots=True)
class Held:
    """The answer to a hold: ``granted`` (falsy when not), what the scope holds, its limit.

    ``held`` counts the scope's live holds after a grant (this one included),
    or before a denial.  ``never_fits``: the amount alone is over the limit.
    """

    granted: bool
    scope: str
    amount: int
    held: int
    limit: int | None

    @property
    def never_fits(self) -> bool:
        return self.limit is not None and self.amount > self.limit

    def __bool__(self) -> bool:
        return self.granted


class _MemoryHolds:
    def __init__(self, backend: MemoryBackend) -> None:
        self._clock = backend.clock
        self._lock = threading.Lock()
        self._scopes: dict[str, dict[str, tuple[int, float]]] = {}

    def run(self, scope: str, key: str, amount: int, limit: int | None,
            ttl: float) -> tuple[bool, int]:
        """The Lua script's algorithm: drop expired holds, check, hold; ``amount < 0``: read."""
        now = self._clock.monotonic()
        with self._lock:
            holds = self._scopes.setdefault(scope, {})
            for name in [k for k, (_, expiry) in holds.items() if expiry <= now]:
                del holds[name]
            held = sum(a for k, (a, _) in holds.items() if k != key)
            if amount < 0:
                return True, held + (holds[key][0] if key in holds else 0)
            if key not in holds and limit is not None and held + amount > limit:
                return False, held
            holds[key] = (amount, now + ttl)
            return True, held + amount

    def release(self, scope: str, key: str) -> bool:
        with self._lock:
            return self._scopes.get(scope, {}).pop(key, None) is not None


class _RedisHolds:
    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._script: Any = None

    def _key(self, scope: str) -> str:
        return key_of(self._backend.prefix, HOLDS, scope)

    def _call(self, what: str, fn: Any) -> Any:
        import redis  # the redis extra is installed: the backend exists

        try:
            return fn(self._backend.clients.sync_client())
        except redis.RedisError as exc:
            raise BackendError(f"Redis at {self._backend.url} failed to {what}: {exc}") from exc

    def run(self, scope: str, key: str, amount: int, limit: int | None,
            ttl: float) -> tuple[bool, int]:
        def call(client: Any) -> Any:
            if self._script is None:
                self._script = client.register_script(_HOLD_LUA)
            return self._script(keys=[self._key(scope)],
                                args=[key, amount, -1 if limit is None else limit, ttl],
                                client=client)

        ok, held = self._call(f"hold {scope}", call)
        return bool(int(ok)), int(held)

    def release(self, scope: str, key: str) -> bool:
        return bool(self._call(f"release {scope}",
                               lambda client: client.hdel(self._key(scope), key)))


_Impl = _MemoryHolds | _RedisHolds
_BY_BACKEND: weakref.WeakKeyDictionary[Any, _Impl] = weakref.WeakKeyDictionary()
_BY_BACKEND_LOCK = threading.Lock()


def _impl_of(limiter: Limiter) -> _Impl:
    backend = limiter.backend
    with _BY_BACKEND_LOCK:
        impl = _BY_BACKEND.get(backend)
        if impl is None:
            if isinstance(backend, MemoryBackend):
                impl = _MemoryHolds(backend)
            elif isinstance(backend, RedisBackend):
                impl = _RedisHolds(backend)
            else:
                raise TypeError(f"held capacity needs a memory:// or redis:// limiter, got "
                                f"{type(backend).__name__}")
            _BY_BACKEND[backend] = impl
        return impl


class HeldCapacity:
    """Hold and release a scope's ``enqueued_tokens`` through ``limiter``'s backend.

    >>> from rateloop.admission import Limiter, LimitSpec
    >>> limiter = Limiter(limits={"openai:m:p:batch": LimitSpec(enqueued_tokens=1_000)})
    >>> queue = HeldCapacity(limiter)
    >>> bool(queue.hold("openai:m:p:batch", "b1", 800, ttl=3600))
    True
    >>> queue.hold("openai:m:p:batch", "b2", 300, ttl=3600).held   # denied: 800 held
    800
    >>> queue.release("openai:m:p:batch", "b1"), queue.held("openai:m:p:batch")
    (True, 0)
    """

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self._impl = _impl_of(limiter)

    def __repr__(self) -> str:
        return f"HeldCapacity({self.limiter!r})"

    def limit(self, scope: str) -> int | None:
        """The scope's configured ``enqueued_tokens`` (None: unlimited)."""
        spec = self.limiter.limits_for(scope)
        return spec.enqueued_tokens if spec is not None else None

    def hold(self, scope: str, key: str, amount: int, *, ttl: float) -> Held:
        """Hold ``amount`` in ``scope`` under ``key`` for at most ``ttl`` seconds, or deny.

        Holding a key that is already held is granted and replaces its amount.
        """
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
            raise ValueError(f"a hold's amount must be an integer >= 0, got {amount!r}")
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not (
                0 < ttl < math.inf):
            raise ValueError(f"a hold's ttl must be a number of seconds > 0, got {ttl!r}")
        if not isinstance(key, str) or not key:
            raise ValueError(f"a hold's key must be a non-empty string, got {key!r}")
        limit = self.limit(scope)
        granted, held = self._impl.run(scope, key, amount, limit, float(ttl))
        return Held(granted=granted, scope=scope, amount=amount, held=held, limit=limit)

    def release(self, scope: str, key: str) -> bool:
        """Free the hold ``key``; False when it was not held (released already, or expired)."""
        return self._impl.release(scope, key)

    def held(self, scope: str) -> int:
        """The amount the scope's live holds add up to."""
        return self._impl.run(scope, "", -1, None, 1.0)[1]
