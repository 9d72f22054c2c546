"""The last lines of a failed attempt's own output, made safe to print again.

A step that fails for a reason that is not a rate limit ends with
``Error: claude failed (exit 1)``; what the agent itself said ("Invalid API
key · Please run /login") is often on its stdout, which ``rateloop run``
captures and never prints for a failed attempt.  So the final error is
preceded by an excerpt: the last :data:`EXCERPT_LINES` non-blank lines of the
attempt's stderr, or of its stdout when stderr is empty, under a dim header.

What is echoed is cleaned first: terminal escape sequences and control
characters are removed (a carriage-return progress line keeps only what a
terminal would show last), each line is cut to :data:`MAX_LINE_CHARS`, and
anything shaped like an API key or a bearer token is replaced by
``[redacted]`` (:func:`rateloop._redact.redact`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rateloop._redact import redact

__all__ = ["EXCERPT_LINES", "MAX_LINE_CHARS", "OutputExcerpt", "excerpt_of"]

#: How many lines of a failed attempt's output are shown.
EXCERPT_LINES = 10
#: A longer line is cut (with ``…``): one minified JSON blob must not flood the log.
MAX_LINE_CHARS = 500

# Linear-time patterns (each scan stops at the next ESC or terminator; no nested repeats).
_OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?")
_ESC = re.compile(r"\x1b[ -/]*[0-~]?")  # other escapes: ESC ( B, ESC 7, ...
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_DIM, _RESET = "\x1b[2m", "\x1b[0m"


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputExcerpt:
    """The cleaned, redacted last ``lines`` of one stream (``source``: stderr or stdout)."""

    source: str
    lines: tuple[str, ...]

    def render(self, label: str, *, color: bool = False) -> str:
        """The header and the lines; the header is dim when ``color`` (a terminal).

        >>> print(OutputExcerpt(source="stdout", lines=("Invalid API key",)).render("claude"))
        --- last line of claude's stdout ---
        Invalid API key
        """
        count = len(self.lines)
        what = "last line" if count == 1 else f"last {count} lines"
        header = f"--- {what} of {label}'s {self.source} ---"
        if color:
            header = f"{_DIM}{header}{_RESET}"
        return "\n".join((header, *self.lines))


def _clean_line(line: str) -> str:
    line = line.rsplit("\r", 1)[-1]  # a progress line: what the terminal shows last
    line = _CONTROL.sub("", line).rstrip()
    if len(line) > MAX_LINE_CHARS:
        line = line[: MAX_LINE_CHARS - 1] + "…"
    return redact(line)


def _last_lines(text: str, count: int) -> tuple[str, ...]:
    text = _ESC.sub("", _CSI.sub("", _OSC.sub("", text)))
    kept: list[str] = []
    for raw in reversed(text.split("\n")):
        line = _clean_line(raw)
        if line.strip():
            kept.append(line)
            if len(kept) == count:
                break
    return tuple(reversed(kept))


def excerpt_of(
    *,
    stderr: str,
    stdout: str,
    lines: int = EXCERPT_LINES,
    refusal: tuple[str, ...] = (),
    needle: str | None = None,
) -> OutputExcerpt | None:
    """The lines that carry the refusal, whichever stream they are on; None if none shows.

    ``refusal`` are the refusal texts read from the agent's own result
    (``codex exec --json`` writes its error on stdout, and stderr holds only
    "Reading additional input from stdin..."): they are shown first.  Else
    the stream whose text contains ``needle`` (the evidence the signal was
    read from), else stderr, else stdout when stderr has no visible line.

    >>> excerpt_of(stderr="", stdout="Invalid API key · Please run /login\\n")
    OutputExcerpt(source='stdout', lines=('Invalid API key · Please run /login',))
    >>> excerpt_of(stderr="\\x1b[31mboom\\x1b[0m\\n", stdout="ignored").lines
    ('boom',)
    """
    if refusal:
        kept = _last_lines("\n".join(refusal), lines)
        if kept:
            return OutputExcerpt(source="result", lines=kept)
    streams = [("stderr", stderr), ("stdout", stdout)]
    if needle and needle.lower() not in stderr.lower() and needle.lower() in stdout.lower():
        streams.reverse()
    for source, text in streams:
        kept = _last_lines(text, lines)
        if kept:
            return OutputExcerpt(source=source, lines=kept)
    return None
