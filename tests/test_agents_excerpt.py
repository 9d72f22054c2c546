"""The excerpt of a failed attempt's own output: which stream, which lines, cleaned and redacted."""

from __future__ import annotations

import io

import pytest

from rateloop.agents.excerpt import EXCERPT_LINES, MAX_LINE_CHARS, OutputExcerpt, excerpt_of
from rateloop.agents.runner import _colors


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stderr_first_then_stdout() -> None:
    assert excerpt_of(stderr="boom\n", stdout="out\n") == OutputExcerpt(
        source="stderr", lines=("boom",)
    )
    assert excerpt_of(stderr="", stdout="Invalid API key · Please run /login\n") == OutputExcerpt(
        source="stdout", lines=("Invalid API key · Please run /login",)
    )
    # stderr with only blank lines and escape codes has nothing to show: stdout it is.
    assert excerpt_of(stderr="\n \n\x1b[0m\n", stdout="real\n") == OutputExcerpt(
        source="stdout", lines=("real",)
    )
    assert excerpt_of(stderr="", stdout="") is None
    assert excerpt_of(stderr="\n\n", stdout="\r\n") is None


def test_only_the_last_lines_without_blanks() -> None:
    text = "\n".join(f"line {i}" for i in range(1, 31)) + "\n\n\n"
    excerpt = excerpt_of(stderr=text, stdout="")
    assert excerpt is not None
    assert excerpt.lines == tuple(f"line {i}" for i in range(31 - EXCERPT_LINES, 31))
    assert excerpt_of(stderr="a\n\nb\n", stdout="", lines=5) == OutputExcerpt(
        source="stderr", lines=("a", "b")
    )


def test_terminal_sequences_and_controls_are_removed() -> None:
    text = (
        "\x1b]0;window title\x07\x1b[1;31mError:\x1b[0m failed\n"
        "progress 10%\rprogress 100%\n"
        "bell\x07 and \x00nul \x9bcsi\n"
        "\x1b(Bcharset\n"
    )
    excerpt = excerpt_of(stderr=text, stdout="")
    assert excerpt is not None
    assert excerpt.lines == ("Error: failed", "progress 100%", "bell and nul csi", "charset")


def test_secrets_are_redacted() -> None:
    key = "sk-ant-api03-" + "a" * 40
    excerpt = excerpt_of(
        stderr=f"Invalid x-api-key: {key}\nAuthorization: Bearer abc.def.ghi\n", stdout=""
    )
    assert excerpt is not None
    text = "\n".join(excerpt.lines)
    assert key not in text and "abc.def.ghi" not in text
    assert text == "Invalid x-api-key: [redacted]\nAuthorization: [redacted]"


def test_long_lines_are_cut() -> None:
    excerpt = excerpt_of(stderr="x" * 10_000 + "\n", stdout="")
    assert excerpt is not None
    (line,) = excerpt.lines
    assert len(line) == MAX_LINE_CHARS and line.endswith("…")


def test_render_header_is_dim_only_on_request() -> None:
    excerpt = OutputExcerpt(source="stderr", lines=("a", "b"))
    assert excerpt.render("claude") == "--- last 2 lines of claude's stderr ---\na\nb"
    assert excerpt.render("claude", color=True) == (
        "\x1b[2m--- last 2 lines of claude's stderr ---\x1b[0m\na\nb"
    )


def test_colors_follow_the_terminal_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert _colors(_Terminal()) is True
    assert _colors(io.StringIO()) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert _colors(_Terminal()) is False


def test_hostile_output_is_cleaned_in_linear_time() -> None:
    # 64 KiB of unterminated escape introducers: the tail rateloop keeps, at its worst.
    for text in ("\x1b]" * 32_768, "\x1b[" + "1;" * 32_000, "\r" * 65_536, "\x1b" * 65_536):
        excerpt_of(stderr=text, stdout=text)  # returns (quickly) without raising
