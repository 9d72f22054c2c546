"""The live status page: a read-only HTTP server over the limiter's Redis state.

How it works.  One poller thread reads a :class:`~rateloop.observe.state.Snapshot`
every ``interval`` seconds (however many browsers watch, Redis sees one
reader) and compares it with the previous one to grow a timeline: a scope
paused or resumed, requests admitted (the rise of a scope's day count, else
of its requests bucket net of what drained: an estimate), a day window or
the concurrency slots running out, a bucket the provider blocked; and, when
the workers share their events through a
:class:`~rateloop.observe.redis_events.RedisEventSink`, their waits,
rejections (local: admission; remote: the provider) and fallbacks -- and each
scope's card its calls waiting now by priority (:mod:`rateloop.observe.waiters`).
The notable entries (pauses, resumes, fallbacks, skips, stops) are kept apart
from the routine ones (admissions, waits) and read from their own stream, so a
burst of admissions never pushes a pause off the page: the timeline served is
the newest ``ROUTINE_SERVED`` routine entries and the newest ``NOTABLE_SIZE``
notable ones, merged newest first.  With a
task store it also serves the queue: depth, the oldest task, and each parked
task's ``retry_at`` and remaining steps.  The
HTTP server answers ``GET`` only: the page and its two static files
(package data, no build step) and ``/api/state``, the latest snapshot and
timeline as JSON, which the page polls, and ``/metrics``: the state gauges of
:mod:`rateloop.observe.state_metrics` for Prometheus to scrape.  It binds to
127.0.0.1 unless told otherwise; a non-loopback address needs
``allow_remote=True``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from rateloop._redact import redact
from rateloop.admission.history import check_minutes
from rateloop.errors import BackendError
from rateloop.observe._bind import check_bind
from rateloop.observe.present import human_duration, inherited_from, verdict
from rateloop.observe.queue_state import read_queue
from rateloop.observe.state import DimensionState, ScopeState, Snapshot

__all__ = ["Dashboard", "timeline_entries", "url_of"]

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
    # uPlot (MIT), vendored: see static/uPlot.VERSION and static/uPlot.LICENSE.
    "/uPlot.iife.min.js": ("uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/uPlot.min.css": ("uPlot.min.css", "text/css; charset=utf-8"),
    "/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
}
TIMELINE_SIZE = 500
#: The routine entries served (newest first) and the notable entries kept and served.
ROUTINE_SERVED = 200
NOTABLE_SIZE = 100
# The entries the dashboard makes itself from two snapshots that count as notable.
_NOTABLE_KINDS = frozenset({"pause", "resume"})
_PLAIN = "text/plain; charset=utf-8"


def _entry(at: datetime, kind: str, scope: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"at": at.isoformat(), "kind": kind, "scope": scope, "text": text, **extra}


def _admitted(old: ScopeState, new: ScopeState, seconds: float) -> float:
    """Requests admitted on a scope between two reads (exact for a day count)."""
    by_old = {d.dimension: d for d in old.dimensions}
    for name in ("requests_per_day", "requests"):
        now = next((d for d in new.dimensions if d.dimension == name), None)
        before = by_old.get(name)
        if now is None or before is None:
            continue
        if name == "requests_per_day":
            if now.resets_at != before.resets_at:  # a new day window began
                return now.used
            return max(0.0, now.used - before.used)
        drained = max(0.0, before.used - before.effective / 60.0 * seconds)
        return max(0.0, now.used - drained)
    return 0.0


def timeline_entries(old: Snapshot | None, new: Snapshot) -> list[dict[str, Any]]:
    """What changed from ``old`` to ``new``, as timeline entries (oldest first)."""
    if old is None:
        return [
            _entry(new.at, "pause", s.scope, _pause_text(s), until=_iso(s.paused_until))
            for s in new.scopes
            if s.paused
        ]
    seconds = max(0.0, (new.at - old.at).total_seconds())
    before = {s.scope: s for s in old.scopes}
    out: list[dict[str, Any]] = []
    for s in new.scopes:
        prev = before.get(s.scope)
        if prev is None:
            prev = ScopeState(
                scope=s.scope, configured=s.configured, factor=1.0, paused_until=None,
                pause_reason=None, leases=0,
            )  # fmt: skip
        if s.paused and (not prev.paused or s.paused_until != prev.paused_until):
            out.append(_entry(new.at, "pause", s.scope, _pause_text(s), until=_iso(s.paused_until)))
        elif prev.paused and not s.paused:
            out.append(_entry(new.at, "resume", s.scope, "resumed"))
        n = round(_admitted(prev, s, seconds)) if prev.dimensions else 0
        if n > 0:
            out.append(_entry(new.at, "admit", s.scope, f"admitted ~{n}", count=n))
        was_empty = {d.dimension for d in prev.dimensions if _exhausted(d)}
        for d in s.dimensions:
            if _exhausted(d) and d.dimension not in was_empty:
                out.append(_entry(new.at, "exhausted", s.scope, f"no headroom on {d.dimension}"))
        if s.factor < prev.factor - 1e-6:
            out.append(_entry(new.at, "lowered", s.scope, f"AIMD factor lowered to {s.factor:.2f}"))
    return out


def _exhausted(d: DimensionState) -> bool:
    """Out of headroom in a way worth a timeline entry.

    A paced bucket (its capacity is a second or so of its rate) is empty
    after every call by design; it counts only when the provider blocked it.
    A day window or the concurrency slots running out is news.
    """
    if d.kind == "bucket":
        return d.blocked_until is not None
    return d.headroom < 1


def _views(snap: Snapshot) -> dict[str, dict[str, Any]]:
    """What the page says of each scope, in :mod:`rateloop.observe.present`'s words
    (the status table's): its verdict and the scope whose limits it is within."""
    out = {}
    for s in snap.scopes:
        parent = inherited_from(s, snap)
        out[s.scope] = {
            "verdict": verdict(s, snap).to_dict(snap.at),
            "within": parent.scope if parent is not None else None,
        }
    return out


def _left(when: datetime, now: datetime) -> str:
    return human_duration((when - now).total_seconds())


def _queue_view(queue: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The queue with its durations said in words: the oldest task's age, each wake-up."""
    age = queue["oldest_age_secs"]
    waiting = [
        {**t, "wakes_in": _left(datetime.fromisoformat(t["retry_at"]), now)}
        if t["retry_at"]
        else {**t, "wakes_in": None}
        for t in queue["waiting"]
    ]
    oldest = "-" if age is None else human_duration(age)
    return {**queue, "waiting": waiting, "oldest_age": oldest}


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _pause_text(s: ScopeState) -> str:
    until = s.paused_until.strftime("%H:%M:%S") if s.paused_until else "?"
    return f"paused until {until}" + (f" ({s.pause_reason})" if s.pause_reason else "")


class Dashboard:
    """The page and ``/api/state`` over a state reader (``reader.read() -> Snapshot``)."""

    def __init__(
        self,
        reader: Any,
        *,
        store: Any = None,
        host: str = "127.0.0.1",
        port: int = 8765,
        allow_remote: bool = False,
        interval: float = 0.5,
        history_minutes: int = 60,
    ) -> None:
        check_bind(host, allow_remote=allow_remote)
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.history_minutes = check_minutes(history_minutes, key="history_minutes")
        self._history: dict[str, Any] = {}
        self._reader = reader
        self._store = store
        self._queue: dict[str, Any] | None = None
        self.host, self.port, self.interval = host, port, interval
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._error: str | None = None
        self._timeline: deque[dict[str, Any]] = deque(maxlen=TIMELINE_SIZE)
        self._notable: deque[dict[str, Any]] = deque(maxlen=NOTABLE_SIZE)
        self._events_after: str | None = None
        self._notable_after: str | None = None
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    def __repr__(self) -> str:
        return f"Dashboard({url_of(self.host, self.port)}, reader={self._reader!r})"

    # -- reading ------------------------------------------------------------------------

    def poll_once(self) -> None:
        """Read Redis once and extend the timeline."""
        read_events = getattr(self._reader, "read_events", None)
        read_notable = getattr(self._reader, "read_notable_events", None)
        try:
            snap = self._reader.read()
            events: list[dict[str, Any]] = []
            notable: list[dict[str, Any]] = []
            if read_events is not None:  # the workers' events, when a RedisEventSink shares them
                self._events_after, events = read_events(self._events_after)
            if read_notable is not None:
                self._notable_after, notable = read_notable(self._notable_after)
                # The notable events come from their own stream: each is shown once.
                events = [e for e in events if not e.get("notable")]
            queue = read_queue(self._store, snap.at).to_dict() if self._store is not None else None
            history = self._read_history(snap)
        except BackendError as exc:
            with self._lock:
                self._error = str(exc)
            return
        for entry in timeline_entries(self._snapshot, snap):
            (notable if entry["kind"] in _NOTABLE_KINDS else events).append(entry)
        with self._lock:
            self._timeline.extend(events)
            self._notable.extend(notable)
            self._snapshot, self._error, self._queue = snap, None, queue
            self._history = history

    def _read_history(self, snap: Snapshot) -> dict[str, Any]:
        """Each scope's last minutes, when the reader keeps a history (``read_history``)."""
        read_history = getattr(self._reader, "read_history", None)
        if read_history is None:
            return {}
        past = read_history(
            self.history_minutes, scopes=[s.scope for s in snap.scopes], now=snap.at.timestamp()
        )
        return {scope: h.to_dict() for scope, h in past.items()}

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # a dead poller would freeze the page: show it and go on
                with self._lock:
                    self._error = redact(f"reading the state failed: {type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def state(self) -> dict[str, Any]:
        """What ``/api/state`` serves."""
        with self._lock:
            snap, error, queue = self._snapshot, self._error, self._queue
            history = self._history
            routine = list(self._timeline)[-ROUTINE_SERVED:]
            notable = list(self._notable)
        # Oldest first, then a stable sort by time: entries of one moment keep their order.
        timeline = sorted(notable + routine, key=lambda e: datetime.fromisoformat(e["at"]))
        return {
            "snapshot": snap.to_dict() if snap is not None else None,
            "views": _views(snap) if snap is not None else {},
            "queue": _queue_view(queue, snap.at) if queue and snap is not None else queue,
            "error": error,
            "timeline": timeline[::-1],  # newest first
            "interval": self.interval,
            "history": history,
            "history_minutes": self.history_minutes,
            "served_at": datetime.now(UTC).isoformat(),
        }

    def metrics(self) -> bytes | None:
        """The state gauges in the Prometheus text format (``/metrics``), read now.

        None when prometheus_client is not installed (``rateloop[prometheus]``).
        """
        try:
            from prometheus_client import CollectorRegistry, generate_latest
        except ImportError:
            return None
        from rateloop.observe.state_metrics import ScopeStateCollector

        registry = CollectorRegistry()
        registry.register(ScopeStateCollector(self._reader, store=self._store))
        return generate_latest(registry)

    # -- serving ---------------------------------------------------------------------------

    def start(self) -> int:
        """Start the poller and the server threads; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("the dashboard is already running")
        self.poll_once()  # the first page load already has data
        server_class = _IPv6Server if ":" in self.host else ThreadingHTTPServer
        server = server_class((self.host, self.port), _handler(self.state, self.metrics))
        server.daemon_threads = True
        self._server = server
        self.port = int(server.server_address[1])
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._poll, name="rateloop-dashboard-poll", daemon=True),
            threading.Thread(
                target=server.serve_forever, name="rateloop-dashboard-http", daemon=True
            ),
        ]
        for t in self._threads:
            t.start()
        return self.port

    def wait(self) -> None:
        """Block until :meth:`stop` (from another thread) or Ctrl-C."""
        while not self._stop.wait(0.5):
            pass

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []

    def __enter__(self) -> Dashboard:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def url_of(host: str, port: int) -> str:
    """``http://host:port/``, an IPv6 address in brackets.

    >>> url_of("::1", 8765)
    'http://[::1]:8765/'
    """
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _handler(
    state: Callable[[], dict[str, Any]], metrics: Callable[[], bytes | None]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "rateloop-dashboard"

        def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Security-Policy", "default-src 'self'")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/api/state":
                body = json.dumps(state(), sort_keys=True).encode()
                self._send(HTTPStatus.OK, body, "application/json")
                return
            if path == "/metrics":
                self._metrics()
                return
            static = _STATIC.get(path)
            if static is None:
                self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
                return
            name, ctype = static
            data = resources.files("rateloop.observe").joinpath("static", name).read_bytes()
            self._send(HTTPStatus.OK, data, ctype)

        def _metrics(self) -> None:
            try:
                text = metrics()
            except BackendError as exc:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, f"{exc}\n".encode(), _PLAIN)
                return
            if text is None:
                msg = b"/metrics needs prometheus_client: pip install 'rateloop[prometheus]'\n"
                self._send(HTTPStatus.NOT_FOUND, msg, _PLAIN)
                return
            self._send(HTTPStatus.OK, text, "text/plain; version=0.0.4; charset=utf-8")

        do_HEAD = do_GET

        def _read_only(self) -> None:
            self._send(
                HTTPStatus.METHOD_NOT_ALLOWED, b"read-only: GET only\n", "text/plain; charset=utf-8"
            )

        do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a page polling twice a second would flood the terminal

    return Handler
