"""Random policy documents for the loader's fuzz tests (tests/test_policy_fuzz.py, bench/).

A document is shaped like a policy file, with every table the schema knows,
and filled with what a person or a generator gets wrong: values of the wrong
kind, empty and unknown keys, numbers past every bound (and NaN, infinity),
mixed-case URL schemes, scope keys that are not scopes, and tables, lists
and junk nested where a leaf belongs.  Keys are strings as in TOML, and now
and then a YAML-only key (an integer, ``None``, a boolean).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from rateloop.admission.spec import LimitSpec
from rateloop.policy._schema import SCHEMA, Leaf

__all__ = ["policy_documents"]

_LIMIT_FIELDS = list(LimitSpec.__dataclass_fields__)
_ROUTE_FIELDS = [
    "provider", "model", "project", "tenant", "context_window", "tags",
    "input_price_per_mtok", "output_price_per_mtok",
]  # fmt: skip
_WORDS = [
    "", " ", "openai", "OpenAI", "gpt-5", "openai:gpt-5", "openai:gpt-5:proj", "a:b:c:d:e",
    "memory://", "MEMORY://", "redis://127.0.0.1:6379/0", "REDIS://127.0.0.1:6379/0",
    "Rediss://h:6380", "redis+cluster://h:7000", "redis://h:0", "redis://h:99999",
    "redis://[::1", "unix:///tmp/r.sock", "127.0.0.1:6379", "://", "fixed", "rolling",
    "00:00", "24:00", "anthropic", "exponential", "equal", "fail", "soft", "local",
    "backoff.max_delay_secs", 'limits."openai:gpt-5"', "governance", "limits", "\x00", "é",
]  # fmt: skip
_NUMBERS = st.one_of(
    st.integers(min_value=-10, max_value=1_000),
    st.sampled_from([0, -1, 2**31, 2**63, 10**13, 10**30, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_SCALARS = st.one_of(
    st.booleans(),
    st.none(),
    _NUMBERS,
    st.sampled_from(_WORDS),
    st.text(max_size=12),
)
_JUNK: st.SearchStrategy[Any] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["", "a", "max_attempts", "x y"]), inner, max_size=3),
    ),
    max_leaves=6,
)


def _keys(known: list[str]) -> st.SearchStrategy[Any]:
    """Mostly the table's own keys, else an empty key, a typo, text or a YAML-only key."""
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known),
        st.sampled_from(["", " ", "rpm", "max_attemps", "limits", "backoff"]),
        st.text(max_size=8),
        st.sampled_from([0, 1, None, True]),
    )


def _values() -> st.SearchStrategy[Any]:
    return st.one_of(_SCALARS, _SCALARS, _JUNK)


def _good(leaf: Leaf) -> st.SearchStrategy[Any]:
    """Values the leaf accepts (so that one bad value is not hidden behind many)."""
    if leaf.kind == "bool":
        return st.booleans()
    if leaf.kind in ("int", "float"):
        lo, hi = int(leaf.lo or 0) + 1, int(min(leaf.hi or 10**6, 10**6))
        return st.integers(min_value=lo, max_value=max(lo, hi))
    if leaf.kind == "choice":
        return st.sampled_from(leaf.choices)
    if leaf.kind == "url":
        return st.sampled_from(["memory://", "MEMORY://", "redis://h:6379/0", "Redis://h/1"])
    if leaf.kind == "strs":
        return st.lists(st.sampled_from(["openai", "anthropic", "pii"]), max_size=2)
    return st.sampled_from(["openai", "gpt-5", "pii"])


_GOOD_LIMITS: dict[str, st.SearchStrategy[Any]] = {
    **dict.fromkeys(_LIMIT_FIELDS, st.integers(min_value=1, max_value=10**6)),
    "day_window": st.sampled_from(["fixed", "rolling"]),
    "day_resets_at": st.sampled_from(["00:00", "23:59"]),
    "burst": st.sampled_from([0.5, 1]),
    "reserve": st.sampled_from([0, 0.1]),
    "profile": st.sampled_from(["openai", "anthropic"]),
}


def _table(
    known: list[str], good: dict[str, st.SearchStrategy[Any]], values: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """A table of mostly good values for known keys, with a few bad keys and values."""

    @st.composite
    def table(draw: st.DrawFn) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        # Each known key half of the time, its value bad one time in three ...
        for key in known:
            if draw(st.booleans()):
                bad = key not in good or draw(st.integers(min_value=0, max_value=2)) == 0
                out[key] = draw(values if bad else good[key])
        # ... and now and then a key that is empty, misspelt, random or not a string.
        for _ in range(draw(st.integers(min_value=0, max_value=2))):
            out[draw(_keys(known))] = draw(values)
        return out

    # Now and then not a table at all.
    return st.one_of(table(), table(), table(), table(), table(), _JUNK)


_ROUTE = _table(
    _ROUTE_FIELDS,
    {
        "provider": st.sampled_from(["openai", "anthropic"]),
        "model": st.sampled_from(["gpt-5", "claude"]),
        "tags": st.just(["pii"]),
    },
    st.one_of(_values(), st.lists(st.sampled_from(_WORDS), max_size=3)),
)
_SCOPES = st.one_of(
    st.sampled_from(["openai:gpt-5", "openai:gpt-5:proj", "anthropic:claude"]),
    st.sampled_from(["openai:gpt-5", "OpenAI:gpt-5", "gpt-5", "", "a:b:c:d:e", 0]),
    st.text(max_size=10),
)
_LIMITS = st.one_of(
    st.dictionaries(_SCOPES, _table(_LIMIT_FIELDS, _GOOD_LIMITS, _values()), max_size=3),
    _JUNK,
)


def _subtable(name: str) -> st.SearchStrategy[Any]:
    known = list(SCHEMA[name])
    if name == "fallback":
        values = st.one_of(_values(), st.lists(st.one_of(_ROUTE, _JUNK), max_size=3))
    elif name == "governance":
        values = st.one_of(
            _values(), st.lists(st.one_of(st.sampled_from(_WORDS), _JUNK), max_size=3)
        )
    else:
        values = _values()
    good = {k: _good(leaf) for k, leaf in SCHEMA[name].items()}
    good["routes"] = st.lists(_ROUTE, max_size=2)
    good["locked"] = st.lists(
        st.sampled_from(["max_attempts", "backoff", 'limits."openai:gpt-5".burst']), max_size=2
    )
    return _table(known, good, values)


_TOP_KEYS = [*SCHEMA[""], "backoff", "fallback", "agents", "admission", "governance", "limits"]


def _top_value(key: Any) -> st.SearchStrategy[Any]:
    if key == "limits":
        return _LIMITS
    if isinstance(key, str) and key in SCHEMA and key:
        return _subtable(key)
    return _values()


@st.composite
def policy_documents(draw: st.DrawFn) -> dict[Any, Any]:
    """One random policy document (a mapping, as a TOML or YAML file would load)."""
    doc: dict[Any, Any] = {}
    for key in _TOP_KEYS:
        if draw(st.integers(min_value=0, max_value=2)) == 0:
            continue
        bad = draw(st.integers(min_value=0, max_value=3)) == 0
        doc[key] = draw(
            _good(SCHEMA[""][key]) if key in SCHEMA[""] and not bad else _top_value(key)
        )
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        doc[draw(_keys(_TOP_KEYS))] = draw(_values())
    return doc
