"""Policy: defaults, every validation bound at its edge, loaders and error messages."""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from rateloop.admission.spec import LimitSpec
from rateloop.errors import ConfigError
from rateloop.policy import (
    AdmissionPolicy,
    AgentsPolicy,
    FallbackPolicy,
    Governance,
    Layer,
    Policy,
)
from rateloop.route import Route
from rateloop.timing.backoff import Backoff
from rateloop.timing.budget import CallBudget


def nested(dotted: str, value: Any) -> dict[str, Any]:
    """``nested("backoff.multiplier", 2)`` → ``{"backoff": {"multiplier": 2}}``."""
    *tables, leaf = dotted.split(".")
    data: dict[str, Any] = {leaf: value}
    for table in reversed(tables):
        data = {table: data}
    return data


def test_defaults() -> None:
    p = Policy()
    assert (p.max_attempts, p.recovery_budget_secs, p.pause_limit_secs) == (20, 600.0, 3600.0)
    assert (p.initial_delay_secs, p.max_delay_secs, p.multiplier) == (5.0, 60.0, 2.0)
    assert (p.strategy, p.jitter, p.trigger_scope, p.on_exhausted) == (
        "exponential",
        "equal",
        "transient",
        "fail",
    )
    assert p.attempts_per_route is None
    assert p.max_wait_secs is None
    assert p.fallback == FallbackPolicy()
    assert dict(p.limits) == {}
    assert p.agents == AgentsPolicy(
        max_retries=5,
        base_delay_secs=60,
        max_delay_secs=600,
        fallback_auto_model=False,
        max_step_output_bytes=10_000_000,
    )
    assert p.admission == AdmissionPolicy(
        backend="memory://", on_unreachable="fail_closed", local_share=1.0, local_lease_secs=None
    )
    assert p.governance == Governance(locked=())
    assert Policy.from_dict({}) == p


def test_policy_is_frozen_and_limits_read_only() -> None:
    p = Policy.from_dict({"limits": {"openai:gpt-5": {"requests_per_minute": 5}}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_attempts = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.limits["x"] = LimitSpec()  # type: ignore[index]
    assert p.limits["openai:gpt-5"] == LimitSpec(requests_per_minute=5)
    assert hash(p) == hash(Policy.from_dict({"limits": {"openai:gpt-5": {"burst": 0.5}}}))
    assert p != Policy.from_dict({"limits": {"openai:gpt-5": {"burst": 0.5}}})


def test_backoff_and_budget_from_policy() -> None:
    p = Policy.from_dict(
        {
            "max_attempts": 4,
            "max_wait_secs": 90,
            "backoff": {"initial_delay_secs": 2, "max_delay_secs": 30, "jitter": "none"},
        }
    )
    b = p.backoff(rng=lambda: 0.5)
    assert b == Backoff(initial=2, max_delay=30, multiplier=2, jitter="none")
    assert Backoff.from_policy(p) == b
    assert [b.delay(n) for n in range(1, 7)] == [2, 4, 8, 16, 30, 30]
    budget = p.budget(started_at=10)
    assert isinstance(budget, CallBudget)
    assert (budget.max_attempts, budget.max_wait_secs) == (4, 90)
    assert budget.time_left(20) == 80


# -- every bound at its edge ------------------------------------------------

ROUTE = {"provider": "anthropic", "model": "claude-sonnet-4-5"}

# (dot-path, rejected values, accepted values, extra keys that make the edge reachable)
EDGES: list[tuple[str, list[Any], list[Any], dict[str, Any]]] = [
    ("max_attempts", [0, 1001, -1, True, 5.0, "5", None], [1, 1000], {}),
    ("recovery_budget_secs", [0, 0.999, 86_400.001, math.inf, math.nan, True], [1, 86_400], {}),
    ("pause_limit_secs", [0, 0.5, 86_401, False], [1, 1.0, 86_400], {}),
    ("attempts_per_route", [0, 1001, 2.0], [1, 1000, None], {"max_attempts": 1000}),
    ("max_wait_secs", [0, 0.99, 86_401], [1, 86_400, None], {}),
    ("trigger_scope", ["rate_limit", "", "ALL", 1], ["rate-limit", "transient", "all"], {}),
    ("on_exhausted", ["raise", None], ["fail", "soft"], {}),
    (
        "backoff.initial_delay_secs",
        [0, 0.999, 86_401, -5],
        [1, 86_400],
        {"backoff": {"max_delay_secs": 86_400}},
    ),
    (
        "backoff.max_delay_secs",
        [0.999, 86_400.5, "60"],
        [1, 86_400],
        {"backoff": {"initial_delay_secs": 1}},
    ),
    ("backoff.multiplier", [0.999, 0, math.inf, True, 100.5, 1e6], [1, 1.5, 100], {}),
    (
        "backoff.strategy",
        ["fibonacci", ""],
        ["exponential", "linear", "constant", "decorrelated"],
        {},
    ),
    ("backoff.jitter", ["some", "Full"], ["none", "equal", "full"], {}),
    ("agents.max_retries", [-1, 101, 5.5, False], [0, 100], {}),
    ("agents.base_delay_secs", [-0.001, 86_401], [0, 86_400], {}),
    ("agents.max_delay_secs", [-1, 86_400.1], [0, 86_400], {}),
    ("agents.fallback_auto_model", [1, "yes", None], [True, False], {}),
    ("agents.max_step_output_bytes", [0, -1, 1.5, 10**12 + 1, 2**1024], [1, 10**12], {}),
    (
        "admission.backend",
        ["", 5, "redis://h:notaport/0", "redis://h:99999/0", "redis://h:0/0", "127.0.0.1:6379"],
        ["memory://", "redis://127.0.0.1:6379/0", "redis://:pw@h/0", "unix:///tmp/r.sock"],
        {},
    ),
    ("admission.on_unreachable", ["open", "fail-closed"], ["fail_closed", "local"], {}),
    ("admission.local_share", [0, -0.1, 1.0001, math.nan], [1e-9, 0.5, 1], {}),
    ("admission.local_lease_secs", [0, -1, 60.001, math.nan, "1", True], [0.01, 1, 60, None], {}),
    ("fallback.max_cost_usd", [-0.01, "1", 1e6 + 1, 10**400], [0, 2.5, 1e6, None], {}),
    ("fallback.allowed_providers", ["openai", [1], [""]], [[], ["openai"], None], {}),
    ("fallback.data_class", ["", 3], ["pii", None], {}),
    (
        "fallback.routes",
        [ROUTE, [{"provider": "a:b", "model": "m"}], [{"model": "m"}]],
        [[ROUTE]],
        {},
    ),
    (
        "governance.locked",
        ["max_attempts", ["nope"], ["governance.locked"]],
        [["max_attempts"]],
        {},
    ),
]


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize(
    ("path", "value", "extra"),
    [(path, v, extra) for path, bad, _, extra in EDGES for v in bad],
    ids=lambda x: repr(x)[:40],
)
def test_edge_rejected(path: str, value: Any, extra: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.from_dict(_merge(extra, nested(path, value)), source="edge.toml")
    keys = [e.key or "" for e in info.value.errors]
    assert any(k.startswith(path) for k in keys), keys
    assert all(e.source == "edge.toml" for e in info.value.errors)
    assert all(e.allowed for e in info.value.errors)


@pytest.mark.parametrize(
    ("path", "value", "extra"),
    [(path, v, extra) for path, _, good, extra in EDGES for v in good],
    ids=lambda x: repr(x)[:40],
)
def test_edge_accepted(path: str, value: Any, extra: dict[str, Any]) -> None:
    p = Policy.from_dict(_merge(extra, nested(path, value)))
    effective = p.leaves()[path]
    if isinstance(effective, frozenset | tuple) and isinstance(value, list):
        assert len(effective) == len(value)
    elif isinstance(value, float) and math.isnan(value):  # pragma: no cover - never accepted
        raise AssertionError
    else:
        assert effective == value
    assert p.provenance[path] == "code"


def test_cross_field_bounds_at_their_edge() -> None:
    same = Policy.from_dict({"backoff": {"initial_delay_secs": 60, "max_delay_secs": 60}})
    assert same.initial_delay_secs == same.max_delay_secs == 60
    with pytest.raises(ConfigError) as info:
        Policy.from_dict({"backoff": {"initial_delay_secs": 60.5, "max_delay_secs": 60}})
    assert info.value.key == "backoff.initial_delay_secs"
    assert "max_delay_secs" in str(info.value)
    assert Policy.from_dict({"max_attempts": 5, "attempts_per_route": 5}).attempts_per_route == 5
    with pytest.raises(ConfigError, match="attempts_per_route 6 is above max_attempts 5"):
        Policy.from_dict({"max_attempts": 5, "attempts_per_route": 6})


def test_route_table_fields() -> None:
    route = {
        **ROUTE,
        "project": "p1",
        "context_window": 200_000,
        "tags": ["pii"],
        "input_price_per_mtok": 3.0,
        "output_price_per_mtok": 15,
    }
    p = Policy.from_dict({"fallback": {"routes": [route], "allowed_providers": ["anthropic"]}})
    assert p.fallback.routes == (
        Route(
            provider="anthropic",
            model="claude-sonnet-4-5",
            project="p1",
            context_window=200_000,
            tags=frozenset({"pii"}),
            input_price_per_mtok=3.0,
            output_price_per_mtok=15.0,
        ),
    )
    assert p.fallback.allowed_providers == frozenset({"anthropic"})
    for bad in ({"context_window": 0}, {"input_price_per_mtok": -1}, {"tags": "pii"}):
        with pytest.raises(ConfigError):
            Policy.from_dict({"fallback": {"routes": [{**ROUTE, **bad}]}})


def test_limits_are_validated_by_limit_spec() -> None:
    with pytest.raises(ConfigError) as info:
        Policy.from_dict({"limits": {"openai:gpt-5": {"burst": 2}}}, source="org.toml")
    assert info.value.key == 'limits."openai:gpt-5".burst'
    assert info.value.source == "org.toml"
    with pytest.raises(ConfigError, match="must be a table"):
        Policy.from_dict({"limits": {"openai:gpt-5": 5}})


# -- building in code -----------------------------------------------------------


def test_code_values_are_validated_like_files() -> None:
    with pytest.raises(ConfigError) as info:
        Policy(max_attempts=0, jitter="some")  # type: ignore[arg-type]
    assert {e.key for e in info.value.errors} == {"max_attempts", "backoff.jitter"}
    assert {e.source for e in info.value.errors} == {"code"}
    with pytest.raises(ConfigError, match="initial_delay_secs 90"):
        Policy(initial_delay_secs=90)
    with pytest.raises(ConfigError, match=r"agents\.max_retries"):
        AgentsPolicy(max_retries=101)
    with pytest.raises(ConfigError, match=r"admission\.local_share"):
        AdmissionPolicy(local_share=0)
    with pytest.raises(ConfigError, match=r"governance\.locked"):
        Governance(locked=("nope",))
    with pytest.raises(ConfigError, match=r"fallback\.routes"):
        FallbackPolicy(routes=("anthropic",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="limits"):
        Policy(limits={"a": 5})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="agents"):
        Policy(agents={"max_retries": 3})  # type: ignore[arg-type]


def test_code_values_are_normalized() -> None:
    p = Policy(recovery_budget_secs=600, governance=Governance(locked=('limits."a:b"',)))
    assert isinstance(p.recovery_budget_secs, float)
    assert p.governance.locked == ('limits."a:b"',)
    fb = FallbackPolicy(allowed_providers=["openai"])  # type: ignore[arg-type]
    assert fb.allowed_providers == frozenset({"openai"})
    assert Policy(provenance={"x": "y"}) == Policy()  # provenance is not part of equality


# -- files ---------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


FULL_TOML = """
max_attempts = 8
recovery_budget_secs = 300
pause_limit_secs = 1800
trigger_scope = "rate-limit"
on_exhausted = "soft"
attempts_per_route = 4
max_wait_secs = 900

[backoff]
strategy = "linear"
initial_delay_secs = 2
max_delay_secs = 30
multiplier = 1.5
jitter = "full"

[fallback]
allowed_providers = ["anthropic"]
max_cost_usd = 0.5
data_class = "pii"

[[fallback.routes]]
provider = "anthropic"
model = "claude-sonnet-4-5"
tags = ["pii"]

[limits."openai:gpt-4.1:proj-1"]
requests_per_minute = 500

[agents]
max_retries = 3
fallback_auto_model = true

[admission]
backend = "redis://127.0.0.1:6379/0"
on_unreachable = "local"
local_share = 0.25

[governance]
locked = ["max_attempts"]
"""


def test_toml_yaml_and_pyproject_load_the_same_policy(tmp_path: Path) -> None:
    toml_policy = Policy.from_toml(write(tmp_path, "p.toml", FULL_TOML))
    assert toml_policy.max_attempts == 8
    assert toml_policy.strategy == "linear"
    assert toml_policy.fallback.data_class == "pii"
    assert toml_policy.limits["openai:gpt-4.1:proj-1"].requests_per_minute == 500
    assert toml_policy.agents.fallback_auto_model is True
    assert toml_policy.admission.local_share == 0.25
    assert toml_policy.governance.locked == ("max_attempts",)

    data = tomllib.loads(FULL_TOML)
    yaml_policy = Policy.from_yaml(write(tmp_path, "p.yaml", yaml.safe_dump(data)))
    assert yaml_policy == toml_policy
    body = re.sub(r"^\[(\[?)", r"[\1tool.rateloop.", FULL_TOML, flags=re.MULTILINE)
    pyproject = write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n[tool.rateloop]\n' + body)
    assert Policy.from_pyproject(pyproject) == toml_policy
    assert Policy.from_file(pyproject) == toml_policy
    assert Policy.from_file(tmp_path / "p.yaml") == toml_policy


def test_pyproject_without_table_is_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n')
    assert Policy.from_pyproject(path) == Policy()


def test_error_message_names_file_key_value_and_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "org.toml", "max_attempts = 1001\n[backoff]\njitter = 'sometimes'\n")
    with pytest.raises(ConfigError) as info:
        Policy.from_toml(path)
    text = str(info.value)
    assert "2 configuration errors" in text
    for needle in (
        str(path),
        "max_attempts",
        "1001",
        "an integer from 1 to 1000",
        "backoff.jitter",
        "'sometimes'",
        "'none' | 'equal' | 'full'",
    ):
        assert needle in text
    first = info.value.errors[0]
    assert (first.source, first.key, first.value) == (str(path), "max_attempts", 1001)


def test_unknown_keys_get_a_hint_at_every_level(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.toml",
        "max_atempts = 3\ninitial_delay_secs = 2\n[backof]\n[agents]\nmax_retry = 2\n"
        '[[fallback.routes]]\nprovider = "a"\nmodel = "b"\nprojct = "c"\n',
    )
    with pytest.raises(ConfigError) as info:
        Policy.from_toml(path)
    messages = {e.key: e.detail for e in info.value.errors}
    assert "did you mean 'max_attempts'?" in messages["max_atempts"]
    assert "belongs in [backoff]" in messages["initial_delay_secs"]
    assert "did you mean 'backoff'?" in messages["backof"]
    assert "did you mean 'max_retries'?" in messages["agents.max_retry"]
    assert "did you mean 'project'?" in messages["fallback.routes[0].projct"]


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("bad.toml", "max_attempts = 3\nrecovery_budget_secs = \n", "line 2"),
        ("bad.yaml", "max_attempts: 3\nbackoff: [1\n  jitter: x\n", "line 3"),
    ],
)
def test_syntax_error_names_file_and_line(tmp_path: Path, name: str, text: str, line: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as info:
        Policy.from_file(path)
    assert info.value.source == str(path)
    assert line in str(info.value)


def test_unreadable_and_unsupported_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Policy.from_toml(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"\.json"):
        Policy.from_file(write(tmp_path, "p.json", "{}"))
    with pytest.raises(ConfigError, match="must be a table of keys"):
        Policy.from_yaml(write(tmp_path, "list.yaml", "- 1\n- 2\n"))
    assert Policy.from_yaml(write(tmp_path, "empty.yaml", "")) == Policy()


def test_docs_and_example_cover_every_key() -> None:
    root = Path(__file__).resolve().parent.parent
    docs = (root / "docs" / "policy.md").read_text(encoding="utf-8")
    example = Policy.from_toml(root / "examples" / "policy.toml")
    text = (root / "examples" / "policy.toml").read_text(encoding="utf-8")
    # Shown commented out: set, it would skip every fallback without the tag (the README's).
    commented = {
        "fallback.data_class": '# data_class = "pii"',
        # Set, it would turn local leases on (off by default).
        "admission.local_lease_secs": "# local_lease_secs = 0.5",
    }
    for path in Policy().leaves():
        table, _, name = path.rpartition(".")
        assert f"`{name}`" in docs, path
        if table:
            assert f"`[{table}]`" in docs or f"[{table}]" in docs, table
        if path in commented:
            assert commented[path] in text, path
            continue
        assert example.provenance[path].endswith("policy.toml"), path


@pytest.mark.parametrize(
    "data",
    [
        {"max_attempts": 10**400},
        {"backoff": {"max_delay_secs": 10**400}},
        {"pause_limit_secs": 10**400},
    ],
)
def test_a_huge_integer_is_a_config_error_not_an_overflow(data: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="invalid value"):
        Policy.from_dict(data)


# --- issue 10: keys no route can match, bounds on every number, secrets ----------------------


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("gpt-4o", "is not a scope: write provider:model"),
        ("OpenAI:gpt-4o", "routes name providers in lowercase, e.g. 'openai:gpt-4o'"),
        ("openai:", "is not a scope"),
        ("a:b:c:d:e", "is not a scope"),
        ("openai:gpt 4o", "is not a scope"),
    ],
)
def test_a_limits_key_that_no_route_can_match_fails_loading(key: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)) as info:
        Policy.from_dict({"limits": {key: {"concurrency": 2}}})
    assert info.value.key is not None and info.value.key.startswith("limits.")
    with pytest.raises(ConfigError, match=re.escape(says)):
        Policy(limits={key: LimitSpec(concurrency=2)})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("burst", 10**400),
        ("reserve", 10**400),
        ("lease_ttl_secs", 10**400),
        ("requests_per_minute", 2**1024),
        ("tokens_per_minute", 10**12 + 1),
        ("concurrency", 10**6 + 1),
    ],
)
def test_every_limit_number_has_an_upper_bound(field: str, value: int) -> None:
    with pytest.raises(ConfigError, match="invalid value") as info:
        Policy.from_dict({"limits": {"openai:gpt-5": {field: value}}})
    assert info.value.key == f'limits."openai:gpt-5".{field}'
    assert len(str(info.value)) < 300  # a huge number is described, not printed


def test_every_numeric_key_has_an_upper_bound() -> None:
    from rateloop.policy._schema import _ROUTE_FIELDS, SCHEMA

    leaves = [*(leaf for t in SCHEMA.values() for leaf in t.values()), *_ROUTE_FIELDS.values()]
    numeric = [leaf for leaf in leaves if leaf.kind in ("int", "float")]
    assert numeric and all(leaf.hi is not None for leaf in numeric)


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:s3cretpw@127.0.0.1:6379/0",
        "redis://:s3cretpw@127.0.0.1:6379/0",
        "redis://127.0.0.1:6379/0?password=s3cretpw",
        "rediss://127.0.0.1:6379/0?db=0&password=s3cretpw",
        "unix://:s3cretpw@/tmp/redis.sock?db=0",
    ],
)
def test_a_backend_password_never_shows(url: str) -> None:
    policy = Policy.from_dict({"admission": {"backend": url}})
    assert "s3cretpw" not in repr(policy)
    assert "s3cretpw" not in repr(policy.admission)
    # An invalid value echoed back, and the lock warning naming both values.
    with pytest.raises(ConfigError) as info:
        Policy.from_dict({"admission": {"on_unreachable": url}})
    assert "s3cretpw" not in str(info.value) and "s3cretpw" not in str(info.value.value)
    locked = Policy.layered(
        Layer.defaults(),
        Layer("org", {"admission": {"backend": url}, "governance": {"locked": ["admission"]}}),
        Layer("repo", {"admission": {"backend": url.replace("s3cretpw", "0therpw")}}),
    )
    (warning,) = locked.warnings
    for text in (str(warning), repr(warning)):
        assert "s3cretpw" not in text and "0therpw" not in text
