"""An independent rate-limited provider for the burst bench: no rateloop code inside.

A chat-completions endpoint on 127.0.0.1 written from OpenAI's documented
behaviour alone (stdlib asyncio, run in its own process), so that rateloop is
measured against buckets it did not write:

* two continuously refilled token buckets, requests and tokens, each holding
  ``burst`` seconds of its rate and starting full;
* a request is charged its prompt tokens (the ``x-fake-input-tokens`` header:
  the bench's stand-in for the provider's tokenizer) plus ``max_tokens``, kept
  (OpenAI counts ``max_tokens`` at admission);
* a refused request still spends its request slot (the bucket may go into
  debt), as OpenAI documents ("unsuccessful requests contribute to your
  per-minute limit");
* every answer, 200 or 429, carries ``x-ratelimit-limit-*`` (per minute),
  ``x-ratelimit-remaining-*`` (what the bucket holds at the decision) and
  ``x-ratelimit-reset-*`` (the time until it is full again) in OpenAI's
  duration format (``"20ms"``, ``"1.5s"``, ``"1m30s"``), and a 429's body says
  ``"Please try again in 50ms."``; with ``retry_after`` a 429 also carries a
  ``retry-after`` header (whole seconds, rounded up).  Answers take
  ``latency`` seconds, refusals ``refusal_latency``.

``GET /__stats`` returns the counts; ``POST /__reset`` refills the buckets and
zeroes them.  :class:`BucketProviderProcess` runs it in a child process.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing as mp
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any


def openai_duration(seconds: float) -> str:
    """OpenAI's reset format: ``"0s"``, ``"17ms"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    secs = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{secs}s" if minutes else f"{secs}s"


@dataclass
class Bucket:
    rate: float  # units a second
    capacity: float
    level: float = 0.0
    at: float = 0.0

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def reset_after(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)


@dataclass
class Provider:
    rpm: int
    tpm: int
    burst: float
    latency: float
    refusal_latency: float = 0.01
    retry_after: bool = False
    requests: Bucket = field(init=False)
    tokens: Bucket = field(init=False)
    stats: dict[str, int] = field(default_factory=dict)
    #: (seconds since reset, refused dimension or "", requests held, tokens held) per decision
    trace: list[tuple[float, str, float, float]] = field(default_factory=list)
    started: float = 0.0

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        now = time.monotonic()
        rps, tps = self.rpm / 60.0, self.tpm / 60.0
        self.requests = Bucket(rps, rps * self.burst, rps * self.burst, now)
        self.tokens = Bucket(tps, tps * self.burst, tps * self.burst, now)
        self.started = now
        self.trace = []
        self.stats = {"served": 0, "refused": 0, "refused_requests": 0, "refused_tokens": 0}

    def decide(self, prompt: int, max_tokens: int) -> tuple[str | None, float, dict[str, str]]:
        """(refused dimension or None, wait hint, headers) for one request, now."""
        now = time.monotonic()
        self.requests.refill(now)
        self.tokens.refill(now)
        cost = prompt + max_tokens
        refused: str | None = None
        wait = 0.0
        if self.requests.level < 1:
            refused, wait = "requests", (1 - self.requests.level) / self.requests.rate
        elif self.tokens.level < cost:
            refused, wait = "tokens", (cost - self.tokens.level) / self.tokens.rate
        # Every request spends its slot, refused or not (down to a bucket's worth of debt).
        self.requests.level = max(-self.requests.capacity, self.requests.level - 1)
        if refused is None:
            self.tokens.level -= cost
        self.trace.append((round(now - self.started, 4), refused or "",
                           round(self.requests.level, 2), round(self.tokens.level)))
        headers = {
            "x-ratelimit-limit-requests": str(self.rpm),
            "x-ratelimit-limit-tokens": str(self.tpm),
            "x-ratelimit-remaining-requests": str(max(0, math.floor(self.requests.level))),
            "x-ratelimit-remaining-tokens": str(max(0, math.floor(self.tokens.level))),
            "x-ratelimit-reset-requests": openai_duration(self.requests.reset_after()),
            "x-ratelimit-reset-tokens": openai_duration(self.tokens.reset_after()),
        }
        return refused, wait, headers


def _completion(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench", "object": "chat.completion", "created": int(time.time()),
        "model": "fake-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }


def _refusal(dimension: str, wait: float, limit: int) -> dict[str, Any]:
    unit = "requests per min (RPM)" if dimension == "requests" else "tokens per min (TPM)"
    return {"error": {
        "message": f"Rate limit reached for fake-model in organization org-bench on {unit}: "
                   f"Limit {limit}. Please try again in {openai_duration(wait)}.",
        "type": dimension, "param": None, "code": "rate_limit_exceeded"}}


async def _respond(writer: asyncio.StreamWriter, status: int, body: dict[str, Any],
                   headers: dict[str, str]) -> None:
    data = json.dumps(body).encode()
    reason = {200: "OK", 429: "Too Many Requests", 404: "Not Found"}.get(status, "Error")
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
            f"content-length: {len(data)}", *(f"{k}: {v}" for k, v in headers.items())]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    await writer.drain()


async def _handle(p: Provider, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            method, target, _ = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if target == "/__stats":
                await _respond(writer, 200, p.stats, {})
            elif target == "/__trace":
                await _respond(writer, 200, {"trace": p.trace}, {})
            elif target == "/__reset":
                p.reset()
                await _respond(writer, 200, {}, {})
            elif method == "POST" and target.endswith("/chat/completions"):
                req = json.loads(body or b"{}")
                prompt = int(headers.get("x-fake-input-tokens", "1"))
                cap = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
                out = min(cap, int(headers.get("x-fake-output-tokens", str(cap))))
                refused, wait, rl = p.decide(prompt, cap)
                if refused is None:
                    p.stats["served"] += 1
                    await asyncio.sleep(p.latency)
                    await _respond(writer, 200, _completion(prompt, out), rl)
                else:
                    p.stats["refused"] += 1
                    p.stats[f"refused_{refused}"] += 1
                    if p.retry_after:
                        rl["retry-after"] = str(max(1, math.ceil(wait)))
                    limit = p.rpm if refused == "requests" else p.tpm
                    await asyncio.sleep(p.refusal_latency)
                    await _respond(writer, 429, _refusal(refused, wait, limit), rl)
            else:
                await _respond(writer, 404, {"error": {"message": "not found"}}, {})
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        return
    finally:
        writer.close()


def _serve(config: dict[str, Any], port: Any, ready: Any) -> None:
    async def main() -> None:
        p = Provider(**config)
        server = await asyncio.start_server(lambda r, w: _handle(p, r, w), "127.0.0.1", 0,
                                            backlog=1024)
        port.value = server.sockets[0].getsockname()[1]
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class BucketProviderProcess:
    """The provider in a child process: ``with BucketProviderProcess(...) as p: p.url``."""

    def __init__(self, *, rpm: int, tpm: int, burst: float, latency: float,
                 retry_after: bool = False) -> None:
        self.config = {"rpm": rpm, "tpm": tpm, "burst": burst, "latency": latency,
                       "retry_after": retry_after}
        self.url = ""
        self._proc: Any = None

    def __enter__(self) -> BucketProviderProcess:
        ctx = mp.get_context("spawn")
        port, ready = ctx.Value("i", 0), ctx.Event()
        self._proc = ctx.Process(target=_serve, args=(self.config, port, ready), daemon=True)
        self._proc.start()
        if not ready.wait(30):
            raise RuntimeError("the bucket provider did not start in 30 s")
        self.url = f"http://127.0.0.1:{port.value}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.join(10)

    def _call(self, path: str, method: str) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path, method=method, data=b"" if method == "POST"
                                     else None)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return dict(json.loads(resp.read()))

    def reset(self) -> None:
        self._call("/__reset", "POST")

    def trace(self) -> list[tuple[float, str, float, float]]:
        return [tuple(t) for t in self._call("/__trace", "GET")["trace"]]  # type: ignore[misc]

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._call("/__stats", "GET").items()}
