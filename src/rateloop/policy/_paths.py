"""Policy paths: a key as a tuple of segments, written as a TOML dotted key.

A segment that is not a bare word is quoted (``limits."openai:gpt-4.1".burst``);
a list index stays attached (``routes[0]``).
"""

from __future__ import annotations

import re

__all__ = ["Path", "dotted", "parse_path"]

Path = tuple[str, ...]

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def dotted(path: Path) -> str:
    """``("limits", "openai:gpt-4.1", "burst")`` → ``limits."openai:gpt-4.1".burst``."""
    text = ""
    for part in path:
        if part.startswith("[") and text:  # a list index: routes[0]
            text += part
            continue
        text += ("." if text else "") + (part if _BARE.match(part) else f'"{part}"')
    return text


def parse_path(text: str) -> Path:
    """The inverse of :func:`dotted`; raises ValueError on a malformed path."""
    parts: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == '"':
            end = text.find('"', i + 1)
            if end < 0:
                raise ValueError(f"unclosed quote in {text!r}")
            parts.append(text[i + 1 : end])
            i = end + 1
        else:
            end = text.find(".", i)
            end = n if end < 0 else end
            part = text[i:end].strip()
            if not part:
                raise ValueError(f"empty segment in {text!r}")
            parts.append(part)
            i = end
        if i < n:
            if text[i] != ".":
                raise ValueError(f"expected '.' after a quoted segment in {text!r}")
            i += 1
            if i == n:
                raise ValueError(f"trailing '.' in {text!r}")
    if not parts:
        raise ValueError("empty path")
    return tuple(parts)
