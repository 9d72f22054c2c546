"""Where limiter state lives: the backend protocol, the ``from_url`` registry, two backends.

::

    protocol.py   Backend (the protocol), BackendUnreachable   -- a leaf
    registry.py   register_backend, backend_from_url            -- a leaf
    memory.py     MemoryBackend (memory://)
    redis.py      RedisBackend (redis://, rediss://, unix://, +cluster)
      codec.py      operations as script calls (KEYS, ARGV, decoders)
      scripts.py    the Lua scripts (*.lua package data; admit/settle per plan shape)
      wire.py       the Redis protocol, packed by hand
      clients.py    redis-py clients and the connections the hot path keeps
      keys.py       the Redis key layout (also read by rateloop.observe)

Implementations register themselves when imported; this package imports the
built-in ones so their schemes are known (``redis.py`` loads redis-py only
when a Redis backend is built).
"""

from rateloop.admission.backends import memory, redis  # noqa: F401 - they register their schemes
from rateloop.admission.backends.memory import MemoryBackend
from rateloop.admission.backends.protocol import Backend, BackendUnreachable
from rateloop.admission.backends.registry import (
    BackendFactory,
    backend_from_url,
    register_backend,
    registered_schemes,
)

__all__ = [
    "Backend",
    "BackendFactory",
    "BackendUnreachable",
    "MemoryBackend",
    "backend_from_url",
    "register_backend",
    "registered_schemes",
]
