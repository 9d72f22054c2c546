"""Layering: later layers win leaf by leaf, lists whole, locks hold and are reported; env."""

from __future__ import annotations

import copy
import logging
import pickle
from pathlib import Path

import pytest

from rateloop.errors import ConfigError
from rateloop.policy import Layer, Policy, PolicyWarning
from rateloop.route import Route

ORG = Layer(
    "org.toml",
    {
        "max_attempts": 10,
        "backoff": {"max_delay_secs": 30, "jitter": "full"},
        "fallback": {
            "routes": [{"provider": "a", "model": "m1"}, {"provider": "b", "model": "m2"}],
            "allowed_providers": ["a", "b"],
        },
        "limits": {"openai:gpt-4.1": {"requests_per_minute": 500}},
        "governance": {"locked": ["max_attempts", "backoff.max_delay_secs"]},
    },
)


def test_later_layers_win_leaf_by_leaf() -> None:
    repo = Layer(
        "repo.yaml",
        {
            "backoff": {"initial_delay_secs": 2},
            "limits": {"openai:gpt-4.1": {"concurrency": 4}},
            "recovery_budget_secs": 120,
        },
    )
    p = Policy.layered(Layer.defaults(), ORG, repo)
    assert (p.initial_delay_secs, p.max_delay_secs, p.jitter) == (2, 30, "full")
    assert p.recovery_budget_secs == 120
    spec = p.limits["openai:gpt-4.1"]
    assert (spec.requests_per_minute, spec.concurrency) == (500, 4)
    assert p.provenance["backoff.initial_delay_secs"] == "repo.yaml"
    assert p.provenance["backoff.max_delay_secs"] == "org.toml"
    assert p.provenance["backoff.multiplier"] == "defaults"
    assert p.provenance['limits."openai:gpt-4.1".requests_per_minute'] == "org.toml"
    assert p.provenance['limits."openai:gpt-4.1".concurrency'] == "repo.yaml"
    assert p.provenance['limits."openai:gpt-4.1".burst'] == "defaults"
    assert set(p.provenance) == set(p.leaves())
    assert p.warnings == ()


def test_defaults_layer_is_implicit() -> None:
    assert Policy.layered(ORG) == Policy.layered(Layer.defaults(), ORG)
    assert Policy.layered().provenance == Policy.layered(Layer.defaults()).provenance


def test_lists_are_replaced_whole() -> None:
    repo = Layer(
        "repo.toml",
        {"fallback": {"routes": [{"provider": "c", "model": "m3"}], "allowed_providers": ["c"]}},
    )
    p = Policy.layered(ORG, repo)
    assert p.fallback.routes == (Route(provider="c", model="m3"),)
    assert p.fallback.allowed_providers == frozenset({"c"})
    assert p.provenance["fallback.routes"] == "repo.toml"


def test_locked_change_is_ignored_and_reported(caplog: pytest.LogCaptureFixture) -> None:
    repo = Layer("repo.toml", {"max_attempts": 50, "backoff": {"max_delay_secs": 30}})
    with caplog.at_level(logging.WARNING, logger="rateloop.policy"):
        p = Policy.layered(Layer.defaults(), ORG, repo)
    assert p.max_attempts == 10
    assert p.provenance["max_attempts"] == "org.toml"
    # max_delay_secs was set to the value it already had: not a change, not reported
    assert p.warnings == (
        PolicyWarning(
            path="max_attempts",
            layer="repo.toml",
            attempted_value=50,
            kept_value=10,
            locked_by="org.toml",
        ),
    )
    assert str(p.warnings[0]) == (
        "repo.toml tried to set max_attempts = 50; kept 10 (locked by org.toml)"
    )
    records = [r for r in caplog.records if r.name == "rateloop.policy"]
    assert len(records) == 1
    assert "max_attempts = 50" in records[0].getMessage()
    # a real Warning, which survives pickling and copying like any other
    (warning,) = p.warnings
    assert isinstance(warning, UserWarning)
    assert pickle.loads(pickle.dumps(warning)) == warning == copy.deepcopy(warning)


def test_lock_applies_only_to_later_layers() -> None:
    # the same layer sets and locks a value: its own value applies
    org = Layer("org", {"max_attempts": 7, "governance": {"locked": ["max_attempts"]}})
    assert Policy.layered(org).max_attempts == 7
    # an earlier layer is not affected by a lock placed later
    first = Layer("first", {"pause_limit_secs": 100})
    second = Layer("second", {"governance": {"locked": ["pause_limit_secs"]}})
    third = Layer("third", {"pause_limit_secs": 200})
    p = Policy.layered(first, second, third)
    assert p.pause_limit_secs == 100
    assert p.warnings[0].locked_by == "second"
    assert p.warnings[0].kept_value == 100


def test_lock_keeps_the_default_when_the_locking_layer_sets_nothing() -> None:
    org = Layer("org", {"governance": {"locked": ["on_exhausted"]}})
    p = Policy.layered(org, Layer("repo", {"on_exhausted": "soft"}))
    assert p.on_exhausted == "fail"
    assert p.provenance["on_exhausted"] == "defaults"
    assert p.warnings[0].kept_value == "fail"


def test_locks_accumulate_and_cannot_be_lifted() -> None:
    repo = Layer(
        "repo",
        {"governance": {"locked": ["pause_limit_secs"]}, "pause_limit_secs": 60},
    )
    env = Layer("env", {"governance": {"locked": []}, "max_attempts": 3, "pause_limit_secs": 5})
    p = Policy.layered(ORG, repo, env)
    assert (p.max_attempts, p.pause_limit_secs) == (10, 60)
    assert p.governance.locked == ("max_attempts", "backoff.max_delay_secs", "pause_limit_secs")
    assert p.provenance["governance.locked"] == "org.toml, repo"
    assert [(w.path, w.layer, w.locked_by) for w in p.warnings] == [
        ("max_attempts", "env", "org.toml"),
        ("pause_limit_secs", "env", "repo"),
    ]


def test_a_table_lock_locks_every_leaf_under_it() -> None:
    org = Layer(
        "org",
        {
            "limits": {"openai:gpt-4.1": {"requests_per_minute": 100}},
            "governance": {"locked": ["backoff", 'limits."openai:gpt-4.1"']},
        },
    )
    repo = Layer(
        "repo",
        {
            "backoff": {"jitter": "none"},
            "limits": {"openai:gpt-4.1": {"requests_per_minute": 900, "concurrency": 2}},
        },
    )
    p = Policy.layered(org, repo)
    assert p.jitter == "equal"
    assert p.limits["openai:gpt-4.1"].requests_per_minute == 100
    assert p.limits["openai:gpt-4.1"].concurrency is None
    by_path = {w.path: w for w in p.warnings}
    assert set(by_path) == {
        "backoff.jitter",
        'limits."openai:gpt-4.1".requests_per_minute',
        'limits."openai:gpt-4.1".concurrency',
    }
    assert by_path['limits."openai:gpt-4.1".concurrency'].kept_value is None


def test_errors_of_every_layer_are_reported_together() -> None:
    a = Layer("a.toml", {"max_attempts": 0})
    b = Layer("b.toml", {"backoff": {"jitter": "x"}})
    with pytest.raises(ConfigError) as info:
        Policy.layered(a, b)
    assert [(e.source, e.key) for e in info.value.errors] == [
        ("a.toml", "max_attempts"),
        ("b.toml", "backoff.jitter"),
    ]


def test_cross_field_error_names_the_layer_of_the_value() -> None:
    org = Layer("org.toml", {"backoff": {"max_delay_secs": 10}})
    repo = Layer("repo.toml", {"backoff": {"initial_delay_secs": 20}})
    with pytest.raises(ConfigError) as info:
        Policy.layered(org, repo)
    assert info.value.source == "repo.toml"
    assert info.value.key == "backoff.initial_delay_secs"


def test_layered_takes_layers_only() -> None:
    with pytest.raises(TypeError, match="Layer"):
        Policy.layered({"max_attempts": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source"):
        Layer("", {})


def test_files_layer_in_order(tmp_path: Path) -> None:
    org = tmp_path / "org.toml"
    org.write_text('max_attempts = 4\n[governance]\nlocked = ["max_attempts"]\n')
    repo = tmp_path / "repo.yml"
    repo.write_text("max_attempts: 9\nbackoff:\n  strategy: constant\n")
    p = Policy.layered(Layer.defaults(), Layer.from_file(org), Layer.from_file(repo))
    assert (p.max_attempts, p.strategy) == (4, "constant")
    assert p.warnings[0].layer == str(repo)


# -- environment ----------------------------------------------------------------


def test_env_maps_top_level_and_tables() -> None:
    env = {
        "RATELOOP_MAX_ATTEMPTS": "5",
        "RATELOOP_RECOVERY_BUDGET_SECS": "90.5",
        "RATELOOP_ATTEMPTS_PER_ROUTE": "none",
        "RATELOOP_BACKOFF__JITTER": "full",
        "RATELOOP_BACKOFF__MAX_DELAY_SECS": "30",
        "RATELOOP_AGENTS__FALLBACK_AUTO_MODEL": "yes",
        "RATELOOP_FALLBACK__ALLOWED_PROVIDERS": "openai, anthropic",
        "RATELOOP_GOVERNANCE__LOCKED": "max_attempts",
        "UNRELATED": "x",
    }
    p = Policy.from_env(environ=env)
    assert (p.max_attempts, p.recovery_budget_secs, p.attempts_per_route) == (5, 90.5, None)
    assert (p.jitter, p.max_delay_secs) == ("full", 30)
    assert p.agents.fallback_auto_model is True
    assert p.fallback.allowed_providers == frozenset({"openai", "anthropic"})
    assert p.governance.locked == ("max_attempts",)
    assert p.provenance["backoff.jitter"] == "env"


def test_env_ignores_the_agent_runner_and_test_keys() -> None:
    env = {
        "RATELOOP_MAX_RETRIES": "not-a-number",
        "RATELOOP_BASE_DELAY_SECS": "-3",
        "RATELOOP_MAX_DELAY_SECS": "x",
        "RATELOOP_FALLBACK_AUTO_MODEL": "1",
        "RATELOOP_MAX_STEP_OUTPUT_BYTES": "0",
        "RATELOOP_REQUIRE_SERVICES": "1",
        "RATELOOP_TEST_REDIS_URL": "redis://x",
    }
    assert Policy.from_env(environ=env) == Policy()


def test_env_is_strict() -> None:
    env = {
        "RATELOOP_MAX_ATTEMPTS": "five",
        "RATELOOP_BACKOFF__MULTIPLIER": "0.5",
        "RATELOOP_AGENTS__FALLBACK_AUTO_MODEL": "maybe",
    }
    with pytest.raises(ConfigError) as info:
        Policy.from_env(environ=env)
    assert {(e.source, e.key, e.value) for e in info.value.errors} == {
        ("env", "max_attempts", "five"),
        ("env", "backoff.multiplier", 0.5),
        ("env", "agents.fallback_auto_model", "maybe"),
    }
    with pytest.raises(ConfigError) as unknown:
        Policy.from_env(environ={"RATELOOP_MAX_ATEMPTS": "3"})
    assert "did you mean RATELOOP_MAX_ATTEMPTS?" in str(unknown.value)
    with pytest.raises(ConfigError, match="BACKOFF__MAX_DELAY_SECS"):
        Policy.from_env(environ={"RATELOOP_BACKOFF_MAX_DELAY_SECS": "3"})


def test_env_prefix_and_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Policy.from_env(prefix="MYAPP_", environ={"MYAPP_MAX_ATTEMPTS": "2"}).max_attempts == 2
    monkeypatch.setenv("MYAPP2_PAUSE_LIMIT_SECS", "120")
    assert Policy.from_env(prefix="MYAPP2_").pause_limit_secs == 120


def test_env_layers_over_files() -> None:
    env = Layer.from_env(environ={"RATELOOP_MAX_ATTEMPTS": "3", "RATELOOP_PAUSE_LIMIT_SECS": "9"})
    p = Policy.layered(Layer.defaults(), ORG, env)
    assert (p.max_attempts, p.pause_limit_secs) == (10, 9)
    assert p.warnings[0].layer == "env"
