"""``rateloop classify``: classify a saved HTTP response or a CLI agent's output.

The HTTP input is what ``curl -i`` prints: a status line (``HTTP/1.1 429 Too
Many Requests`` or ``HTTP/2 429``), headers, a blank line, the body.  CRLF or
LF line ends are accepted, and when there are several header blocks (a
``100 Continue``, a redirect followed with ``-L``, a proxy's ``200 Connection
established``) the last one is the response.  ``--text`` reads an agent's
output instead (with ``--exit-code``).  The signal is printed as one line
saying what it means (:func:`meaning`) above its JSON; ``--json`` prints the
JSON alone, for scripts.  The exit code is 0 whatever the kind, and 2 when the
input cannot be read.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from rateloop.classify._allowance import allowance_words
from rateloop.classify._core import classify
from rateloop.classify._json import signal_dict
from rateloop.classify.text import classify_text
from rateloop.signal import Kind, LimitSignal

__all__ = ["meaning", "parse_http_message", "register", "signal_as_dict"]

_STATUS_LINE = re.compile(r"^HTTP/(\d(?:\.\d)?)\s+(\d{3})(?:\s+(.*))?$", re.IGNORECASE)
_HEADER = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*)$")
_EXIT_UNREADABLE = 2


_MEANINGS: dict[Kind, str] = {
    Kind.OK: "the call succeeded; nothing to do",
    Kind.TEMPORARY: "a short throttle — {wait} and retry",
    Kind.PERIOD_QUOTA: "an allowance for a period (hours, a day, a month) is spent — "
    "it returns{reset}; waiting minutes will not help",
    Kind.SPEND: "billing — a person must add credit; retrying will not help",
    Kind.PERMISSION: "the key, account or project was refused, or has no quota at all "
    "for this model (limit 0) — an operator must act; retrying will not help",
    Kind.INVALID: "the request itself cannot succeed (malformed or larger than its limit) — "
    "change it; retrying will not help",
    Kind.OVERLOAD: "the provider is overloaded — retry later{wait_later} or fall back",
    Kind.SERVER_ERROR: "the provider failed — the same request may succeed later{wait_later}",
    Kind.NETWORK: "no response arrived — retry{wait_later}",
    Kind.UNKNOWN: "not recognised — surfaced as it is, not retried",
}

# Agent text that was read but is not a refusal (rateloop.classify._notices).
_NOTICES = {
    "model fallback notice": "only a model fallback notice — the agent switched models and "
    "went on; not a refusal, surfaced as it is, not retried",
    "usage warning": "only a usage warning — the agent went on; not a refusal, surfaced as "
    "it is, not retried",
}


def meaning(signal: LimitSignal) -> str:
    """One line a person can act on: ``"<kind>: <what it means and what to do>"``.

    >>> from rateloop.signal import Kind, LimitSignal
    >>> meaning(LimitSignal.of(Kind.SPEND))
    'spend: billing — a person must add credit; retrying will not help'
    >>> meaning(LimitSignal.of(Kind.TEMPORARY, retry_after=20.0))
    'temporary: a short throttle — wait at least 20 s and retry'

    When agent text named the allowance that ran out (``code``), the line names it,
    and says so when the agent did not state when it returns:

    >>> meaning(LimitSignal.of(Kind.PERIOD_QUOTA, code="weekly_limit"))[:63]
    'period_quota: the weekly limit is spent — when it returns was n'
    """
    wait = (
        f"wait at least {signal.retry_after:g} s"
        if signal.retry_after is not None
        else "back off briefly"
    )
    reset = f" at {signal.reset_at.isoformat()}" if signal.reset_at is not None else ""
    later = f" (at least {signal.retry_after:g} s)" if signal.retry_after is not None else ""
    text = _MEANINGS[signal.kind].format(wait=wait, reset=reset, wait_later=later)
    allowance = allowance_words(signal.code)
    if allowance is not None and signal.kind is Kind.PERIOD_QUOTA:
        returns = f"it returns{reset}" if reset else "when it returns was not stated"
        text = f"{allowance} is spent — {returns}; waiting minutes will not help"
    elif allowance is not None and signal.kind is Kind.SPEND:
        text = f"{allowance} is used up — a person must act; retrying will not help"
    elif signal.kind is Kind.UNKNOWN and signal.matched in _NOTICES:
        text = _NOTICES[signal.matched]
    if signal.kind is not Kind.OK and (signal.scope or "").startswith(("tool:", "mcp:")):
        # A tool's limit holds the tool, never the model the agent calls.
        text += f" (the limit of {signal.scope}, not of the model)"
    return f"{signal.kind.value}: {text}"


def signal_as_dict(signal: LimitSignal) -> dict[str, Any]:
    """Every field of ``signal`` as JSON-ready values (datetimes in ISO 8601)."""
    return {
        **signal_dict(signal),
        "malformed": list(signal.malformed),
        "observed": [
            {
                "dimension": o.dimension.value,
                "limit": o.limit,
                "remaining": o.remaining,
                "reset_after": o.reset_after,
                "window": o.window,
            }
            for o in signal.observed
        ],
    }


def parse_http_message(text: str) -> tuple[int, list[tuple[str, str]], str]:
    """``(status, headers, body)`` of a ``curl -i`` style response; the last block wins.

    Raises ``ValueError`` naming what was expected when ``text`` does not
    start with an HTTP status line.
    """
    lines = text.split("\n")
    index = 0
    while index < len(lines) and not lines[index].strip():
        index += 1
    status: int | None = None
    headers: list[tuple[str, str]] = []
    while index < len(lines):
        match = _STATUS_LINE.match(lines[index].rstrip("\r"))
        if match is None:
            break
        status, headers = int(match.group(2)), []
        index += 1
        while index < len(lines) and lines[index].rstrip("\r"):
            line = lines[index].rstrip("\r")
            header = _HEADER.match(line)
            if header:
                headers.append((header.group(1), header.group(2).strip()))
            elif line[:1] in (" ", "\t") and headers:  # obsolete line folding
                name, value = headers[-1]
                headers[-1] = (name, f"{value} {line.strip()}")
            index += 1
        index += 1  # the blank line ending the header block
        # Another status line right after means that block was interim (100, 3xx, proxy).
        probe = index
        while probe < len(lines) and not lines[probe].strip():
            probe += 1
        if probe < len(lines) and _STATUS_LINE.match(lines[probe].rstrip("\r")):
            index = probe
            continue
        if 100 <= status < 200 or 300 <= status < 400:
            # An interim or redirect block that kept a body: the response follows it.
            later = next(
                (i for i in range(index, len(lines)) if _STATUS_LINE.match(lines[i].rstrip("\r"))),
                None,
            )
            if later is not None:
                index = later
                continue
        break
    if status is None:
        first = next((line for line in lines if line.strip()), "")[:60]
        raise ValueError(
            f"not an HTTP response: expected a status line like "
            f"'HTTP/1.1 429 Too Many Requests', got {first!r} "
            "(use --text for a CLI agent's output)"
        )
    body = "\n".join(lines[index:]) if index < len(lines) else ""
    return status, headers, body


def _read(source: str | None) -> str:
    try:
        stdin = source is None or source == "-"
        data = sys.stdin.buffer.read() if stdin or source is None else Path(source).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {source!r}: {exc.strerror or exc}") from exc
    # PowerShell's ">" writes UTF-16 with a BOM; editors may add a UTF-8 BOM.
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", "replace")
    return data.decode("utf-8-sig", "replace")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"rateloop classify: {message}", err=True)
    return typer.Exit(code=_EXIT_UNREADABLE)


def classify_command(
    file: Annotated[
        str | None,
        typer.Argument(
            help="A saved response (`curl -i` output) or agent output; '-' or nothing reads stdin.",
            show_default=False,
        ),
    ] = None,
    text: Annotated[
        bool, typer.Option("--text", help="The input is a CLI agent's output, not HTTP.")
    ] = False,
    exit_code: Annotated[
        int | None,
        typer.Option("--exit-code", help="The agent's exit code (with --text); 0 is always ok."),
    ] = None,
    provider: Annotated[
        str | None,
        typer.Option("--provider", help="The provider, instead of detecting it (e.g. openai)."),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the bare JSON only (no meaning line).")
    ] = False,
) -> None:
    """Classify a saved HTTP response or a CLI agent's output: what it means, then its JSON."""
    if exit_code is not None and not text:
        raise _fail("--exit-code only applies with --text")
    try:
        content = _read(file)
        if text:
            signal = classify_text(content, exit_code=exit_code)
        else:
            status, headers, body = parse_http_message(content)
            signal = classify(status, headers, body, provider=provider)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if text and provider:
        signal = _with_provider(signal, provider)
    if not as_json:
        typer.echo(meaning(signal))
    typer.echo(json.dumps(signal_as_dict(signal), indent=2))


def _with_provider(signal: LimitSignal, provider: str) -> LimitSignal:
    return replace(signal, provider=provider.strip().lower())


def register(app: typer.Typer) -> None:
    """Add ``rateloop classify`` to the ``rateloop`` app."""
    app.command(name="classify")(classify_command)
