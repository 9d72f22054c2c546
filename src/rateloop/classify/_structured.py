"""A lenient reader of RFC 8941 lists, for ``RateLimit`` and ``RateLimit-Policy``.

How it works: one pass from left to right that never goes back.  A member is
an item -- a quoted string, or a bare token up to ``;``, ``,`` or whitespace --
then its parameters, ``;name`` or ``;name=value`` (the value quoted or bare);
a comma or the end of the field ends it.  A quoted string counts as one only
when it closes and a delimiter follows it; otherwise the same characters are
read as a bare token (``"a"b`` is the token ``"a"b``).  A member that does not
parse is skipped up to the next comma, and the rest of the field is still
read.  Only the first :data:`MAX_FIELD_CHARS` characters are read.

Why not one pattern: the single regular expression this replaces retried
every start position after a member failed (``"a;" * 2048`` took ~0.3 s), and
it could read each quoted parameter value both as a quoted string and as a
token, so a member with twenty of them and a stray word backtracked through
2^20 readings (seconds; forty took hours).  Here every choice is made once,
by looking at the next character.  Each quoted string is scanned once:
scans never overlap, because a quote inside one scan is escaped and so is
never where a value starts; and after a quote that never closes no later quote
can close either (it is inside that unclosed string), so none is tried again.
"""

from __future__ import annotations

import re

__all__ = ["MAX_FIELD_CHARS", "parse_list"]

#: How much of a structured field is read; a real one is a few dozen characters.
MAX_FIELD_CHARS = 4096

_SPACE = re.compile(r"\s*")
# DOTALL: an escaped line break stays inside the string (it has no other reading).
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BARE = re.compile(r"[^;,\s]*")
_KEY = re.compile(r"[A-Za-z*][\w.*-]*")

Members = dict[str, dict[str, str]]


class _Reader:
    """The field being read, and whether a quote can still close in it."""

    __slots__ = ("quotes_close", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.quotes_close = True

    def skip_space(self, pos: int) -> int:
        match = _SPACE.match(self.text, pos)
        return match.end() if match is not None else pos

    def delimited(self, pos: int) -> bool:
        """Whether only whitespace stands between ``pos`` and a ``;``, a ``,`` or the end."""
        pos = self.skip_space(pos)
        return pos == len(self.text) or self.text[pos] in ";,"

    def value(self, pos: int, *, empty: bool) -> tuple[str, int] | None:
        """The quoted string or bare token at ``pos`` and its end; ``None``: neither fits."""
        text = self.text
        if self.quotes_close and text.startswith('"', pos):
            quoted = _QUOTED.match(text, pos)
            if quoted is None:
                self.quotes_close = False
            elif self.delimited(quoted.end()):
                return quoted.group(), quoted.end()
        bare = _BARE.match(text, pos)
        end = bare.end() if bare is not None else pos
        if (end == pos and not empty) or not self.delimited(end):
            return None
        return text[pos:end], end

    def member(self, pos: int) -> tuple[str, dict[str, str], int] | int:
        """``(name, parameters, end)`` of the member at ``pos``, or where it broke."""
        text = self.text
        item = self.value(self.skip_space(pos), empty=False)
        if item is None:
            return pos
        name, pos = item
        params: dict[str, str] = {}
        while True:
            pos = self.skip_space(pos)
            if pos == len(text) or text[pos] == ",":
                return name.strip('"'), params, pos
            # value() checked the delimiter: this is a ";".
            key = _KEY.match(text, self.skip_space(pos + 1))
            if key is None:
                return pos
            pos = key.end()
            found = ("", pos)
            if text.startswith("=", pos):
                value = self.value(pos + 1, empty=True)
                if value is None:
                    return pos
                found = value
            elif not self.delimited(pos):
                return pos
            text_value, pos = found
            params[key.group().lower()] = text_value.strip('"')


def parse_list(value: str) -> Members:
    """``{member: {parameter: value}}`` of a list field; the first member of a name wins,
    the last parameter of a name within a member.  Quotes are stripped, parameter
    names lowercased.  Never raises on a string."""
    reader = _Reader(value[:MAX_FIELD_CHARS])
    text = reader.text
    members: Members = {}
    pos = 0
    while True:
        found = reader.member(pos)
        if isinstance(found, int):
            end = text.find(",", found)
            if end < 0:
                return members
        else:
            name, params, end = found
            members.setdefault(name, params)
            if end >= len(text):
                return members
        pos = end + 1
