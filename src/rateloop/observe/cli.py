"""``rateloop status`` and ``rateloop dashboard``: the live scope state, for people and scripts.

Both read the limiter's state from Redis (never from a process's memory) and
take the configured limits from policy files (``--config``), since Redis
holds usage, pauses and the AIMD factor but not the limits themselves.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rateloop._clock import system_clock
from rateloop._url import url_scheme
from rateloop.admission.history import HISTORY_MINUTES
from rateloop.errors import BackendError, ConfigError
from rateloop.observe.table import render_history, render_queue, render_table

if TYPE_CHECKING:
    from rateloop.admission.spec import LimitSpec
    from rateloop.observe.redis_state import RedisStateReader

__all__ = ["register_dashboard", "register_status", "render_queue", "render_table"]

_DEFAULT_REDIS = "redis://127.0.0.1:6379/0"

RedisOpt = Annotated[
    str | None,
    typer.Option(
        "--redis",
        help="The limiter's Redis URL (default: the policy's admission.backend when it is "
        f"a redis:// URL, else {_DEFAULT_REDIS}).",
    ),
]
ConfigOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--config",
        "-c",
        help="Policy files (layered in order) whose [limits] give the configured limits.",
    ),
]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="RATELOOP_TASK_STORE",
        help="The task store URL (sqlite:///tasks.db, postgresql://...): show the queue.",
    ),
]
PrefixOpt = Annotated[
    str, typer.Option("--prefix", help="The limiter's key prefix (Limiter.from_url prefix=).")
]


def _fail(message: str) -> typer.Exit:
    """Say ``rateloop: message`` on one line; the caller raises the returned exit 2.

    Bad input (a wrong URL, a busy port, an unreachable Redis) exits 2, never 1
    (a crash's code), and never with a traceback.
    """
    typer.echo(f"rateloop: {' '.join(message.split())}", err=True)
    return typer.Exit(2)


def _limits_and_url(
    config: Sequence[Path] | None, redis: str | None
) -> tuple[dict[str, LimitSpec], str]:
    from rateloop.policy import Layer, Policy

    limits: dict[str, LimitSpec] = {}
    url = redis
    if config:
        try:
            policy = Policy.layered(Layer.defaults(), *(Layer.from_file(p) for p in config))
        except ConfigError as exc:
            raise _fail(f"invalid policy: {exc}") from None
        limits = dict(policy.limits)
        backend = policy.admission.backend
        if url is None and url_scheme(backend) in ("redis", "rediss", "unix"):
            url = backend
    return limits, url or _DEFAULT_REDIS


def _reader(config: Sequence[Path] | None, redis: str | None, prefix: str) -> RedisStateReader:
    from rateloop.observe.redis_state import RedisStateReader, check_redis_url

    limits, url = _limits_and_url(config, redis)
    try:
        check_redis_url(url, key="--redis" if redis is not None else "admission.backend")
        return RedisStateReader(url, prefix=prefix, limits=limits)
    except ConfigError as exc:
        raise _fail(str(exc)) from None


# --- status ---------------------------------------------------------------------------


def _width() -> int:
    """The terminal's width (``COLUMNS`` first); 120 when the output is not a terminal."""
    return shutil.get_terminal_size((120, 24)).columns


def _open_store(url: str | None) -> Any:
    if url is None:
        return None
    from rateloop.observe.queue_state import open_store_readonly

    try:
        return open_store_readonly(url)
    except (BackendError, ConfigError) as exc:
        raise _fail(str(exc)) from None


def status(
    redis: RedisOpt = None,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    prefix: PrefixOpt = "rateloop:",
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until interrupted.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes (--watch).")
    ] = 2.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per read.")] = False,
    history: Annotated[
        int,
        typer.Option(
            "--history",
            min=0,
            max=HISTORY_MINUTES,
            help="Add each scope's last MINUTES of history, minute by minute (0: none).",
        ),
    ] = 0,
) -> None:
    """Show every scope's limits, headroom, pause and waiters (Redis) and the queue (--store)."""
    from rateloop.observe.queue_state import read_queue

    reader = _reader(config, redis, prefix)
    tasks = _open_store(store)
    try:
        while True:
            try:
                snap = reader.read()
                queue = read_queue(tasks, snap.at) if tasks is not None else None
                past = (
                    reader.read_history(
                        history, scopes=[s.scope for s in snap.scopes], now=snap.at.timestamp()
                    )
                    if history
                    else None
                )
            except BackendError as exc:
                raise _fail(str(exc)) from None
            if as_json:
                data = snap.to_dict()
                if queue is not None:
                    data["queue"] = queue.to_dict()
                if past is not None:
                    data["history"] = {scope: h.to_dict() for scope, h in past.items()}
                typer.echo(json.dumps(data, sort_keys=True))
            else:
                if watch:
                    typer.echo("\x1b[2J\x1b[H", nl=False)  # clear the screen between frames
                width = _width()
                typer.echo(render_table(snap, source=reader.url, width=width))
                if past is not None:
                    typer.echo("")
                    typer.echo(render_history(past, minutes=history))
                if queue is not None:
                    typer.echo("")
                    typer.echo(render_queue(queue, source=tasks.url, width=width))
            if not watch:
                return
            system_clock.sleep(interval)
    except KeyboardInterrupt:
        return
    finally:
        reader.close()
        if tasks is not None:
            tasks.close()


def register_status(app: typer.Typer) -> None:
    """Add ``rateloop status`` to the ``rateloop`` app."""
    app.command("status")(status)


# --- dashboard ------------------------------------------------------------------------------


def dashboard(
    redis: RedisOpt = None,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    prefix: PrefixOpt = "rateloop:",
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="0 picks a free port.")
    ] = 8765,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="Allow a non-loopback --host (the page has no authentication).",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between reads of Redis.")
    ] = 0.5,
    history: Annotated[
        int,
        typer.Option(
            "--history", min=1, max=HISTORY_MINUTES, help="Minutes of history the charts show."
        ),
    ] = 60,
) -> None:
    """Serve a read-only live status page of the limiter's scopes (Ctrl-C stops it)."""
    from rateloop.observe._bind import check_bind
    from rateloop.observe.dashboard import Dashboard, url_of

    try:
        check_bind(host, allow_remote=allow_remote)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    reader = _reader(config, redis, prefix)
    tasks = _open_store(store)
    board = Dashboard(
        reader,
        store=tasks,
        host=host,
        port=port,
        allow_remote=allow_remote,
        interval=interval,
        history_minutes=history,
    )
    try:
        bound = board.start()
    except OSError as exc:  # EADDRINUSE, EACCES (a port < 1024), an address not on this host
        board.stop()
        reader.close()
        if tasks is not None:
            tasks.close()
        why = exc.strerror or str(exc)
        raise _fail(
            f"cannot listen on {url_of(host, port).removeprefix('http://').rstrip('/')}: "
            f"{why.lower()}; pass another --port, or --port 0 for a free one"
        ) from None
    typer.echo(f"rateloop dashboard on {url_of(host, bound)} (reading {reader.url}); Ctrl-C stops")
    # The line above is read by scripts (and tests) to find a --port 0 server: flush it.
    sys.stdout.flush()
    try:
        board.wait()
    except KeyboardInterrupt:
        pass
    finally:
        board.stop()
        reader.close()
        if tasks is not None:
            tasks.close()


def register_dashboard(app: typer.Typer) -> None:
    """Add ``rateloop dashboard`` to the ``rateloop`` app."""
    app.command("dashboard")(dashboard)
