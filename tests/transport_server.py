"""A scripted provider on 127.0.0.1 for the transport tests (real HTTP, real sockets).

Each request takes the next :class:`Step` of the script (or the default
success when the script is empty) and is recorded, so a test counts the
attempts the server really saw.  Successes are shaped for the path: OpenAI
chat completions, Anthropic messages, Gemini generateContent.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # a dict (JSON), bytes, or None for the path's default success
    events: list[str] | None = None  # SSE: raw event texts, sent as a stream
    stall: float = 0.0  # seconds between the headers and the body
    drop: bool = False  # close the connection without a response
    chunk_pause: float = 0.0  # seconds between SSE events


def openai_success(model: str, tokens: tuple[int, int] = (11, 7)) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": tokens[0],
            "completion_tokens": tokens[1],
            "total_tokens": sum(tokens),
        },
    }


def anthropic_success(model: str, tokens: tuple[int, int] = (11, 7)) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
    }


def gemini_success(tokens: tuple[int, int] = (11, 7)) -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "hello"}]},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": tokens[0],
            "candidatesTokenCount": tokens[1],
            "totalTokenCount": sum(tokens),
        },
    }


def openai_stream_events(model: str, tokens: tuple[int, int] = (11, 7)) -> list[str]:
    def chunk(delta: dict[str, Any], usage: Any = None, finish: Any = None) -> str:
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta else [],
            "usage": usage,
        }
        return "data: " + json.dumps(body)

    usage = {"prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": 18}
    return [
        chunk({"role": "assistant", "content": "hel"}),
        chunk({"content": "lo"}, finish="stop"),
        chunk({}, usage=usage),
        "data: [DONE]",
    ]


def anthropic_stream_events(model: str, tokens: tuple[int, int] = (11, 7)) -> list[str]:
    def event(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps(data)}"

    message = anthropic_success(model, (tokens[0], 1))
    message["content"] = []
    return [
        event("message_start", {"type": "message_start", "message": message}),
        event(
            "content_block_start",
            {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": ""}},
        ),
        event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": "hello"}},
        ),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": tokens[1]}},
        ),
        event("message_stop", {"type": "message_stop"}),
    ]


ANTHROPIC_OVERLOADED = (
    'event: error\ndata: {"type": "error", "error": '
    '{"type": "overloaded_error", "message": "Overloaded"}}'
)


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedProvider:
    """``with ScriptedProvider() as server: server.url`` — a provider on a free port."""

    def __init__(self) -> None:
        self.script: deque[Step] = deque()
        self.seen: list[Seen] = []
        self.default: Step | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        # ("start" | "answer" | "end", request number); "answer" precedes the body's bytes.
        self.log: list[tuple[str, int]] = []
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, *steps: Step) -> None:
        self.script.extend(steps)

    def count(self, path_part: str = "") -> int:
        return sum(1 for s in self.seen if path_part in s.path)

    def __enter__(self) -> ScriptedProvider:
        self._thread.start()
        return self

    def keep(self, client: Any) -> None:
        """Close ``client`` (sync or async) before the server stops."""
        self._clients.append(client)

    def __exit__(self, *exc: object) -> None:
        try:
            while self._clients:
                closing = self._clients.pop().close()
                if inspect.iscoroutine(closing):
                    asyncio.run(closing)
        finally:
            self._server.shutdown()
            self._server.server_close()

    def _next(self, seen: Seen) -> Step:
        with self._lock:
            self.seen.append(seen)
            if self.script:
                return self.script.popleft()
            return self.default or Step()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            number = 0

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in
                                                      self.headers.items()}, body)
                step = provider._next(seen)
                if step.drop:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                model = body.get("model", "m") if isinstance(body, dict) else "m"
                if step.events is not None or (
                    step.body is None and isinstance(body, dict) and body.get("stream")
                    and step.status == 200
                ):
                    events = step.events
                    if events is None:
                        events = (anthropic_stream_events(model) if "/messages" in self.path
                                  else openai_stream_events(model))
                    self._stream(step, events)
                    return
                payload = step.body
                if payload is None:
                    if "/messages" in self.path:
                        payload = anthropic_success(model)
                    elif ":generateContent" in self.path:
                        payload = gemini_success()
                    else:
                        payload = openai_success(model)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(step.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in step.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.flush()
                if step.stall:
                    time.sleep(step.stall)
                with provider._lock:  # logged before the client can see the answer
                    provider.log.append(("answer", self.number))
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

            def _stream(self, step: Step, events: list[str]) -> None:
                self.send_response(step.status)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                for name, value in step.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.close_connection = True
                try:
                    for text in events:
                        self.wfile.write(text.encode() + b"\n\n")
                        self.wfile.flush()
                        if step.chunk_pause:
                            time.sleep(step.chunk_pause)
                except OSError:
                    pass

            def do_POST(self) -> None:
                with provider._lock:
                    provider.in_flight += 1
                    provider.max_in_flight = max(provider.max_in_flight, provider.in_flight)
                    number = self.number = sum(1 for e, _ in provider.log if e == "start")
                    provider.log.append(("start", number))
                try:
                    self._serve()
                finally:
                    with provider._lock:
                        provider.in_flight -= 1
                        provider.log.append(("end", number))

            def do_GET(self) -> None:
                self._serve()

        return Handler
