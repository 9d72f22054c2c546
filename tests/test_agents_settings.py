"""``rateloop run`` settings: lenient env parsing, aliases, clamps and precedence."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rateloop.agents.settings import (
    AgentSettings,
    SettingsLayer,
    layer_from_env,
    layer_from_policy,
    resolve_settings,
)
from rateloop.errors import ConfigError


def test_defaults() -> None:
    s = AgentSettings.from_env({})
    assert s == AgentSettings(
        max_retries=5,
        base_delay_secs=60.0,
        max_delay_secs=600.0,
        fallback_auto_model=False,
        max_step_output_bytes=10_000_000,
    )
    assert s.max_executions == 6


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        ({"RATELOOP_MAX_RETRIES": "100000"}, "max_retries", 100),
        ({"RATELOOP_MAX_RETRIES": "abc"}, "max_retries", 5),
        ({"RATELOOP_MAX_RETRIES": ""}, "max_retries", 5),
        ({"RATELOOP_MAX_RETRIES": "2.5"}, "max_retries", 5),
        ({"RATELOOP_MAX_RETRIES": " 3 "}, "max_retries", 3),
        ({"RATELOOP_MAX_RETRIES": "-4"}, "max_retries", 0),
        ({"RATELOOP_MAX_RETRIES": "1e9"}, "max_retries", 100),
        ({"RATELOOP_BASE_DELAY_SECS": ""}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "nan"}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "inf"}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "0"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "2.5"}, "base_delay_secs", 2.5),
        ({"RATELOOP_BASE_DELAY_SECS": "-1"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "1e-311"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "0.0004"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "1.2345"}, "base_delay_secs", 1.234),
        ({"RATELOOP_MAX_DELAY_SECS": "x"}, "max_delay_secs", 600.0),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "1024"}, "max_step_output_bytes", 1024),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "0"}, "max_step_output_bytes", 10_000_000),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "lots"}, "max_step_output_bytes", 10_000_000),
        ({"RATELOOP_FALLBACK_AUTO_MODEL": "1"}, "fallback_auto_model", True),
        ({"RATELOOP_FALLBACK_AUTO_MODEL": "yes please"}, "fallback_auto_model", True),
        ({"RATELOOP_FALLBACK_AUTO_MODEL": ""}, "fallback_auto_model", False),
        ({"RATELOOP_FALLBACK_AUTO_MODEL": "0"}, "fallback_auto_model", False),
        ({"RATELOOP_FALLBACK_AUTO_MODEL": "False"}, "fallback_auto_model", False),
    ],
)
def test_env_is_lenient(env: dict[str, str], field: str, expected: object) -> None:
    assert getattr(AgentSettings.from_env(env), field) == expected


def test_max_is_raised_to_base() -> None:
    s = AgentSettings.from_env(
        {"RATELOOP_BASE_DELAY_SECS": "300", "RATELOOP_MAX_DELAY_SECS": "100"}
    )
    assert (s.base_delay_secs, s.max_delay_secs) == (300.0, 300.0)


def test_amplihack_aliases_are_read() -> None:
    s = AgentSettings.from_env(
        {
            "AMPLIHACK_RATELIMIT_MAX_RETRIES": "2",
            "AMPLIHACK_RATELIMIT_BASE_DELAY_SECS": "7",
            "AMPLIHACK_RATELIMIT_MAX_DELAY_SECS": "70",
            "AMPLIHACK_RATELIMIT_FALLBACK_AUTO_MODEL": "1",
        }
    )
    assert s == AgentSettings(
        max_retries=2, base_delay_secs=7.0, max_delay_secs=70.0, fallback_auto_model=True
    )


def test_rateloop_keys_win_over_aliases() -> None:
    s = AgentSettings.from_env(
        {
            "RATELOOP_MAX_RETRIES": "1",
            "AMPLIHACK_RATELIMIT_MAX_RETRIES": "9",
            "RATELOOP_BASE_DELAY_SECS": "3",
            "AMPLIHACK_RATELIMIT_BASE_DELAY_SECS": "30",
            "RATELOOP_MAX_DELAY_SECS": "4",
            "AMPLIHACK_RATELIMIT_MAX_DELAY_SECS": "40",
            "RATELOOP_FALLBACK_AUTO_MODEL": "0",
            "AMPLIHACK_RATELIMIT_FALLBACK_AUTO_MODEL": "1",
        }
    )
    assert (s.max_retries, s.base_delay_secs, s.max_delay_secs, s.fallback_auto_model) == (
        1,
        3.0,
        4.0,
        False,
    )


def test_an_unusable_rateloop_key_falls_back_to_the_alias() -> None:
    env = {"RATELOOP_MAX_RETRIES": "abc", "AMPLIHACK_RATELIMIT_MAX_RETRIES": "2"}
    assert AgentSettings.from_env(env).max_retries == 2


def test_precedence_flags_env_policy_defaults() -> None:
    policy = SettingsLayer(max_retries=1, base_delay_secs=1.0, max_delay_secs=10.0)
    env = layer_from_env({"RATELOOP_BASE_DELAY_SECS": "2", "RATELOOP_MAX_DELAY_SECS": "20"})
    flags = SettingsLayer(max_delay_secs=30.0)
    s = resolve_settings(flags=flags, env=env, policy=policy)
    assert (s.max_retries, s.base_delay_secs, s.max_delay_secs) == (1, 2.0, 30.0)
    assert s.max_step_output_bytes == 10_000_000  # nobody set it: the default
    assert resolve_settings() == AgentSettings()


def test_delays_saturate_at_a_day() -> None:
    s = resolve_settings(flags=SettingsLayer(base_delay_secs=1e308, max_delay_secs=float("inf")))
    assert (s.base_delay_secs, s.max_delay_secs) == (86_400.0, 86_400.0)


def test_flags_are_clamped_like_env() -> None:
    s = resolve_settings(
        flags=SettingsLayer(max_retries=5000, base_delay_secs=9.0, max_delay_secs=1)
    )
    assert (s.max_retries, s.base_delay_secs, s.max_delay_secs) == (100, 9.0, 9.0)


@given(
    st.dictionaries(
        st.sampled_from(
            sorted(
                [
                    "RATELOOP_MAX_RETRIES",
                    "RATELOOP_BASE_DELAY_SECS",
                    "RATELOOP_MAX_DELAY_SECS",
                    "RATELOOP_FALLBACK_AUTO_MODEL",
                    "RATELOOP_MAX_STEP_OUTPUT_BYTES",
                    "AMPLIHACK_RATELIMIT_MAX_RETRIES",
                    "AMPLIHACK_RATELIMIT_BASE_DELAY_SECS",
                    "AMPLIHACK_RATELIMIT_MAX_DELAY_SECS",
                ]
            )
        ),
        st.text(max_size=12),
    )
)
def test_env_parsing_never_raises_and_is_normalized(env: dict[str, str]) -> None:
    s = AgentSettings.from_env(env)
    assert 0 <= s.max_retries <= 100
    assert 0 <= s.base_delay_secs <= s.max_delay_secs
    assert s.max_step_output_bytes > 0
    assert s.normalized() == s


def test_repr_is_readable() -> None:
    assert repr(AgentSettings()) == (
        "AgentSettings(max_retries=5, base_delay_secs=60, max_delay_secs=600, "
        "fallback_auto_model=False, max_step_output_bytes=10000000)"
    )


def test_policy_file_agents_table(tmp_path: Path) -> None:
    toml = tmp_path / "policy.toml"
    toml.write_text("[agents]\nmax_retries = 2\nbase_delay_secs = 5\nfallback_auto_model = true\n")
    layer = layer_from_policy(toml)
    s = resolve_settings(policy=layer, env=layer_from_env({"RATELOOP_BASE_DELAY_SECS": "7"}))
    assert (s.max_retries, s.base_delay_secs, s.max_delay_secs, s.fallback_auto_model) == (
        2,
        7.0,
        600.0,
        True,
    )
    yaml = tmp_path / "policy.yaml"
    yaml.write_text("agents:\n  max_retries: 3\n")
    assert resolve_settings(policy=layer_from_policy(yaml)).max_retries == 3


def test_a_bad_policy_file_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text('[agents]\nmax_retries = "many"\n')
    with pytest.raises(ConfigError, match=r"agents\.max_retries"):
        layer_from_policy(bad)
