"""The Redis backend: every operation is one Lua script, one round trip.

How it works.  Each operation of :mod:`rateloop.admission.plan` is encoded
into ``KEYS``/``ARGV`` by :class:`~.codec.RedisCodec` and run by one script
(``pause.lua``, ``observe.lua``, ``learned.lua``, or the admit and settle
script generated per plan shape: :mod:`.scripts`), shipped as package data.
Scripts are called with ``EVALSHA`` on connections :class:`~.clients.RedisClients`
keeps.  The scripts read the server's ``TIME``, so every worker agrees on the
clock, and they run atomically, so all dimensions of all scopes are admitted
together or not at all, however many processes share the server.  The keys
are laid out by :mod:`.keys`.

Importing this module registers ``redis://``, ``rediss://``, ``unix://`` and
their ``+cluster`` twins; redis-py (the ``rateloop[redis]`` extra) is loaded
only when the first Redis backend is built, so ``import rateloop`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rateloop._clock import Clock
from rateloop._redact import redact_url
from rateloop._url import url_scheme
from rateloop.admission.backends.codec import RedisCodec
from rateloop.admission.backends.protocol import Backend
from rateloop.admission.backends.registry import register_backend

if TYPE_CHECKING:
    from rateloop.admission.backends.clients import RedisClients

__all__ = ["SCHEMES", "RedisBackend", "redact_url"]

#: The URL schemes of a Redis server (``+cluster``: a Redis Cluster, through any node).
SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


class RedisBackend:
    """Limiter state in Redis, shared by every process that uses the same prefix."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "rateloop:",
        socket_timeout: float = 5.0,
        socket_connect_timeout: float | None = None,
        history: bool = True,
        **options: Any,
    ) -> None:
        # Here, not at the top: redis-py is an optional extra, loaded on first use.
        from rateloop.admission.backends.clients import RedisClients

        if "{" in prefix or "}" in prefix:
            raise ValueError(
                f"a Redis key prefix may not contain braces (they make the cluster hash tag), "
                f"got {prefix!r}"
            )
        scheme = url_scheme(url)
        # redis+cluster:// (or rediss+cluster://): a Redis Cluster, through any of its nodes.
        self.cluster = scheme.endswith("+cluster")
        self.url = redact_url(url)
        self.prefix = prefix
        if not isinstance(history, bool):
            raise TypeError(f"history must be True or False, got {history!r}")
        # history: each scope's last 24 h minute by minute, written by the same scripts.
        self.history = history
        self.codec = RedisCodec(prefix, history=history)
        self._packed = not self.cluster  # a cluster client routes by key: no packed commands
        self._clients: RedisClients = RedisClients(
            scheme.removesuffix("+cluster") + url[len(scheme) :],
            self.url,
            cluster=self.cluster,
            options={
                "socket_timeout": socket_timeout,
                "socket_connect_timeout": socket_connect_timeout or socket_timeout,
                "decode_responses": True,
                **options,
            },
        )

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r}, prefix={self.prefix!r})"

    @property
    def clients(self) -> RedisClients:
        """The redis-py clients and the connections this backend keeps."""
        return self._clients

    # -- the Backend protocol ---------------------------------------------------------------

    def execute(self, op: object, *, timeout: float | None = None) -> object:
        """Run ``op`` in one script; ``timeout`` (seconds) bounds the round trip."""
        return self._clients.run(self.codec.encode(op, self._packed), timeout)

    def execute_many(self, ops: list[object]) -> list[object]:
        """Run ``ops`` pipelined (one write and one read per server): each one's answer, or
        the :class:`BackendError` it ended in.

        Each op is atomic, the batch is not.  They run in order -- except that an op
        whose script the server had not cached yet (a fresh or restarted server) runs
        after the others, when it is sent again as ``EVAL``: give it independent ops
        (the lease renewals of different plans)."""
        encode, packed = self.codec.encode, self._packed
        return self._clients.run_many([encode(op, packed) for op in ops])

    async def aexecute(self, op: object, *, timeout: float | None = None) -> object:
        return await self._clients.arun(self.codec.encode(op, self._packed), timeout)

    def close(self) -> None:
        """Close the sync client (async clients: ``aclose`` in their event loop)."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close the async client of the running loop (and forget clients of closed loops)."""
        await self._clients.aclose()


def _redis(url: str, *, clock: Clock, prefix: str, **options: Any) -> Backend:
    return RedisBackend(url, prefix=prefix, **options)


for _scheme in SCHEMES:
    register_backend(_scheme, _redis)
