"""The policy loader under fuzzed documents: a ConfigError naming every bad key, never a crash.

The regressions first (each one found by fuzzing 5,000 policies), then the
property: whatever document comes in, loading it either succeeds or raises
:class:`ConfigError`, and ``rateloop config check`` on it exits 0 or 2 with
no traceback.  ``bench/fuzz_policy.py`` runs the same documents by the
thousand.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from _policy_docs import policy_documents
from rateloop import LimitSpec
from rateloop.cli import app
from rateloop.errors import ConfigError
from rateloop.policy import Layer, Policy

SCOPE = "openai:gpt-5"


def errors_of(data: Any) -> list[ConfigError]:
    with pytest.raises(ConfigError) as caught:
        Policy.from_dict(data, source="p.toml")
    return caught.value.errors


def by_key(errors: list[ConfigError]) -> dict[str | None, ConfigError]:
    return {e.key: e for e in errors}


# -- item 11: a limit field of the wrong kind ------------------------------------------------


@pytest.mark.parametrize("value", [[], {}, ["openai"], {"name": "openai"}, 7, True])
def test_a_profile_that_is_not_a_name_is_a_config_error(value: Any) -> None:
    [err] = errors_of({"limits": {SCOPE: {"profile": value}}})
    assert err.key == f'limits."{SCOPE}".profile'
    assert err.value == value
    assert "'openai'" in (err.allowed or "") and "'anthropic'" in (err.allowed or "")


@pytest.mark.parametrize("value", [[], {}, ["openai"], 7])
def test_a_limit_spec_built_in_code_with_a_profile_that_is_not_a_name(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"profile: invalid value .*'openai'"):
        LimitSpec(requests_per_minute=1, profile=value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("day_window", []),
        ("day_window", {}),
        ("day_resets_at", []),
        ("burst", {}),
        ("reserve", []),
        ("lease_ttl_secs", {}),
        ("requests_per_minute", []),
        ("concurrency", {"a": 1}),
    ],
)
def test_every_limit_field_of_the_wrong_kind_is_a_config_error(field: str, value: Any) -> None:
    [err] = errors_of({"limits": {SCOPE: {field: value}}})
    assert err.key == f'limits."{SCOPE}".{field}'


def test_a_bad_profile_fails_config_check_and_run_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f'[limits."{SCOPE}"]\nprofile = []\n', encoding="utf-8")
    check = CliRunner().invoke(app, ["config", "check", str(path)])
    assert check.exit_code == 2, check.output
    assert check.exception is None or isinstance(check.exception, SystemExit)
    assert f'limits."{SCOPE}".profile: invalid value []' in check.output
    run = CliRunner().invoke(app, ["run", "--policy", str(path), "--", sys.executable, "-c", ""])
    assert run.exit_code == 2, run.output
    assert f'limits."{SCOPE}".profile' in run.output


# -- item 12: an empty key -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"": {"max_attempts": 5}}, '""'),
        ({"": 5}, '""'),
        ({"backoff": {"": 5}}, 'backoff.""'),
        ({"admission": {"": "memory://"}}, 'admission.""'),
        ({"limits": {SCOPE: {"": 1}}}, f'limits."{SCOPE}".""'),
        (
            {"fallback": {"routes": [{"provider": "openai", "model": "m", "": 1}]}},
            'fallback.routes[0].""',
        ),
    ],
)
def test_an_empty_key_is_an_error_at_every_level(data: dict[str, Any], key: str) -> None:
    errs = errors_of(data)
    assert key in by_key(errs), [str(e) for e in errs]
    assert "empty key" in by_key(errs)[key].detail


def test_an_empty_table_name_in_toml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('"" = {max_attempts = 5}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="empty key"):
        Policy.from_toml(path)


# -- item 13: every bad key of a table in one error --------------------------------------------


def test_an_unknown_key_does_not_hide_a_bad_value_beside_it() -> None:
    errs = by_key(errors_of({"limits": {SCOPE: {"rpm": 1, "requests_per_minute": 0}}}))
    assert set(errs) == {f'limits."{SCOPE}".rpm', f'limits."{SCOPE}".requests_per_minute'}
    assert errs[f'limits."{SCOPE}".requests_per_minute'].value == 0
    assert "did you mean" in errs[f'limits."{SCOPE}".rpm'].detail


def test_a_bound_an_unknown_key_and_a_bad_value_are_all_named() -> None:
    spec = {"requests_per_minute": 10_000_000_000_000, "burst": 0, "rpm": 1}
    errs = by_key(errors_of({"limits": {SCOPE: spec}}))
    prefix = f'limits."{SCOPE}".'
    assert set(errs) == {prefix + "requests_per_minute", prefix + "burst", prefix + "rpm"}
    assert "1000000000000" in (errs[prefix + "requests_per_minute"].allowed or "")
    assert errs[prefix + "burst"].value == 0 and "0 < burst <= 1" in (
        errs[prefix + "burst"].allowed or ""
    )


def test_every_bad_key_of_every_table_is_named_together() -> None:
    data = {
        "max_attempts": 0,
        "": 1,
        "backoff": {"jiter": "full", "multiplier": 0},
        "limits": {SCOPE: {"rpm": 1, "burst": 2, "profile": []}, "gpt-5": {}},
    }
    keys = set(by_key(errors_of(data)))
    prefix = f'limits."{SCOPE}".'
    assert keys == {
        "max_attempts",
        '""',
        "backoff.jiter",
        "backoff.multiplier",
        prefix + "rpm",
        prefix + "burst",
        prefix + "profile",
        "limits.gpt-5",
    }


def test_the_message_of_several_errors_lists_each_key_value_and_allowed() -> None:
    with pytest.raises(ConfigError) as caught:
        Policy.from_dict({"limits": {SCOPE: {"rpm": 1, "requests_per_minute": 0}}}, source="f")
    text = str(caught.value)
    assert "2 configuration errors" in text
    assert f'f: limits."{SCOPE}".rpm: unknown key ' in text
    assert f'f: limits."{SCOPE}".requests_per_minute: invalid value 0 (allowed: ' in text


# -- the property ------------------------------------------------------------------------------


def _empty_key_anywhere(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k == "" or _empty_key_anywhere(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_empty_key_anywhere(v) for v in value)
    return False


@seed(22)
@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(doc=policy_documents())
# What 5,000 fuzzed documents found (bench/fuzz_policy.py): a crash, and a silent load.
@example(doc={"limits": {SCOPE: {"profile": [], "burst": 0.5}}, "max_attempts": 3})
@example(doc={"": {"max_attempts": 5}, "backoff": {"jitter": "full"}})
def test_loading_any_document_gives_a_policy_or_a_config_error(doc: dict[Any, Any]) -> None:
    try:
        policy = Policy.layered(Layer.defaults(), Layer("fuzz.yaml", doc))
    except ConfigError as exc:
        for err in exc.errors:
            assert isinstance(err, ConfigError)
            assert err.source == "fuzz.yaml"
        return
    # What loads is usable: every number is finite and an empty key was not accepted.
    assert not _empty_key_anywhere(doc)
    for value in policy.leaves().values():
        if isinstance(value, float):
            assert math.isfinite(value)


@seed(22)
@settings(max_examples=60, deadline=None, database=None)
@given(doc=st.dictionaries(st.sampled_from(["", "a"]), st.none(), max_size=2))
def test_an_empty_key_never_loads(doc: dict[str, None]) -> None:
    if "" in doc:
        with pytest.raises(ConfigError, match="empty key"):
            Policy.from_dict(doc)


_CLI_DOCS = [
    {"limits": {SCOPE: {"profile": []}}},
    {"": {"max_attempts": 5}},
    {"limits": {SCOPE: {"requests_per_minute": 10**13, "burst": 0, "rpm": 1}}},
    {"admission": {"backend": "REDIS://127.0.0.1:6379/0"}},
    {
        "fallback": {"routes": [{"provider": [], "model": {}}, 7]},
        "governance": {"locked": [[]]},
        "backoff": {"max_delay_secs": float("nan"), "multiplier": 10**400},
        0: None,
    },
]


@pytest.mark.parametrize("doc", _CLI_DOCS, ids=range(len(_CLI_DOCS)))
def test_config_check_exits_0_or_2_never_with_a_traceback(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "-m", "rateloop", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode in (0, 2), out.stderr
    assert "Traceback" not in out.stderr
    if out.returncode == 2:
        assert out.stderr.startswith("rateloop: invalid policy: "), out.stderr
