"""A small HTTP/1.1 server for the FakeProvider's ASGI app, on 127.0.0.1, stdlib only.

It speaks what the SDKs need and no more: keep-alive, ``Content-Length`` or
chunked request bodies, chunked streaming responses (SSE).  A ``reset``
fault closes the socket with an RST (``SO_LINGER`` 0) so the client sees a
real connection reset.  :class:`FakeProviderServer` runs it on a thread of
its own (``with FakeProviderServer(fake) as server: server.url``);
``rateloop fake-provider`` runs it in the foreground.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from http import HTTPStatus
from types import TracebackType
from typing import Any

from rateloop.testing._fake.provider import FakeProvider

__all__ = ["FakeProviderServer", "serve"]

_MAX_LINE = 64 * 1024
_MAX_BODY = 32 * 1024 * 1024
_REASONS = {529: "Site Overloaded"}


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return _REASONS.get(status, "Unknown")


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            total += size
            if total > _MAX_BODY:
                raise ValueError("request body too large")
            parts.append(await reader.readexactly(size))
            await reader.readline()
    length = int(headers.get("content-length", "0") or "0")
    if not 0 <= length <= _MAX_BODY:
        raise ValueError(f"bad content-length {length}")
    return await reader.readexactly(length) if length else b""


async def _handle(provider: FakeProvider, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            method, target, _version = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            raw_headers: list[tuple[bytes, bytes]] = []
            while True:
                header = await reader.readline()
                if header in (b"\r\n", b"\n", b""):
                    break
                name, _, value = header.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
                raw_headers.append((name.strip().lower().encode("latin-1"),
                                    value.strip().encode("latin-1")))
            body = await _read_body(reader, headers)
            path, _, query = target.partition("?")
            keep_alive = headers.get("connection", "").lower() != "close"
            if not await _run_app(provider, method, path, query, raw_headers, body, writer,
                                  keep_alive):
                return
            if not keep_alive:
                return
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        return
    finally:
        if not writer.transport.is_closing():
            writer.close()


async def _run_app(
    provider: FakeProvider,
    method: str,
    path: str,
    query: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    writer: asyncio.StreamWriter,
    keep_alive: bool,
) -> bool:
    """Run the app for one request; False when the connection must end."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "headers": headers, "client": None,
             "server": ("127.0.0.1", 0)}
    sent_body = False
    chunked = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if sent_body:
            return {"type": "http.disconnect"}
        sent_body = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal chunked
        if message["type"] == "http.response.start":
            status = message["status"]
            out = [f"HTTP/1.1 {status} {_reason(status)}\r\n".encode()]
            names = set()
            for name, value in message.get("headers", []):
                names.add(name.lower())
                out.append(name + b": " + value + b"\r\n")
            if b"content-length" not in names:
                chunked = True
                out.append(b"transfer-encoding: chunked\r\n")
            out.append(b"connection: keep-alive\r\n" if keep_alive else b"connection: close\r\n")
            writer.write(b"".join(out) + b"\r\n")
        elif message["type"] == "http.response.body":
            data = message.get("body", b"")
            if chunked:
                if data:
                    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                if not message.get("more_body", False):
                    writer.write(b"0\r\n\r\n")
            else:
                writer.write(data)
            await writer.drain()

    try:
        await provider(scope, receive, send)
    except ConnectionResetError:
        _rst(writer)
        return False
    await writer.drain()
    return True


async def serve(provider: FakeProvider, *, host: str = "127.0.0.1", port: int = 0,
                started: Any = None, stop: asyncio.Event | None = None) -> None:
    """Serve ``provider`` until ``stop`` is set (forever without one).

    ``started(port)`` is called once the socket is listening.
    """
    connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections[task] = writer
        try:
            await _handle(provider, reader, writer)
        finally:
            connections.pop(task, None)

    server = await asyncio.start_server(connected, host, port, limit=_MAX_LINE)
    bound = server.sockets[0].getsockname()[1]
    if started is not None:
        started(bound)
    try:
        if stop is None:
            await server.serve_forever()
        else:
            await stop.wait()
    finally:
        server.close()
        # End idle keep-alive connections so that their handlers return on their own
        # (a handler cancelled by asyncio.run's teardown logs a spurious error).
        for writer in list(connections.values()):
            writer.transport.abort()
        if connections:
            await asyncio.wait(list(connections), timeout=5)
        await server.wait_closed()


class FakeProviderServer:
    """Run a :class:`FakeProvider` on ``127.0.0.1`` in a background thread.

    >>> from rateloop.testing import FakeProvider, FakeProviderServer
    >>> with FakeProviderServer(FakeProvider(rpm=60)) as server:
    ...     server.url.startswith("http://127.0.0.1:")
    True
    """

    def __init__(self, provider: FakeProvider, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.provider = provider
        self.host = host
        self._port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:53111`` (OpenAI SDKs want ``url + "/v1"``)."""
        return f"http://{self.host}:{self._port}"

    def start(self) -> FakeProviderServer:
        if self._thread is not None:
            raise RuntimeError("this FakeProviderServer is already started")

        def started(port: int) -> None:
            self._port = port
            self._ready.set()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await serve(self.provider, host=self.host, port=self._port, started=started,
                        stop=self._stop)

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # reported to the starting thread
                self._error = exc
                self._ready.set()

        self._thread = threading.Thread(target=run, name="rateloop-fake-provider", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError("the fake provider server did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(
                f"the fake provider server could not listen on {self.host}:{self._port}: "
                f"{self._error}"
            ) from self._error
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> FakeProviderServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._thread is not None else "stopped"
        return f"FakeProviderServer({self.url}, {state}, {self.provider!r})"
