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
        ({"RATELOOP_MAX_RETRIES": "-4"}, "max_retries", 5),
        ({"RATELOOP_MAX_RETRIES": "1e9"}, "max_retries", 5),
        ({"RATELOOP_BASE_DELAY_SECS": ""}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "nan"}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "inf"}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "0"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "2.5"}, "base_delay_secs", 2.5),
        ({"RATELOOP_BASE_DELAY_SECS": "-1"}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "1_000"}, "base_delay_secs", 60.0),
        ({"RATELOOP_BASE_DELAY_SECS": "\u0661\u0662"}, "base_delay_secs", 60.0),
        ({"RATELOOP_MAX_DELAY_SECS": "-600"}, "max_delay_secs", 600.0),
        ({"RATELOOP_BASE_DELAY_SECS": "1e-311"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "0.0004"}, "base_delay_secs", 0.0),
        ({"RATELOOP_BASE_DELAY_SECS": "1.2345"}, "base_delay_secs", 1.234),
        ({"RATELOOP_MAX_DELAY_SECS": "x"}, "max_delay_secs", 600.0),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "1024"}, "max_step_output_bytes", 1024),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "0"}, "max_step_output_bytes", 10_000_000),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "lots"}, "max_step_output_bytes", 10_000_000),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "1024.0"}, "max_step_output_bytes", 10_000_000),
        ({"RATELOOP_MAX_STEP_OUTPUT_BYTES": "-5"}, "max_step_output_bytes", 10_000_000),
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


# What Rust's ``v.trim().parse::<u32>()`` (amplihack's contract) makes of each value,
# then the clamp to 100.  None: rejected, so the default 5 applies.
U32_CASES = [
    ("0", 0),
    ("3", 3),
    ("+5", 5),
    ("007", 7),
    (" 3 ", 3),
    ("\t4\n", 4),
    ("\u30002\u3000", 2),  # ideographic space is White_Space: trimmed
    ("100", 100),
    ("101", 100),
    ("4294967295", 100),  # u32::MAX: accepted, then clamped
    ("4294967296", None),  # overflow
    ("99999999999999999999", None),
    ("-1", None),
    ("-0", None),
    ("+", None),
    ("++5", None),
    ("+-5", None),
    ("", None),
    ("   ", None),
    ("2.5", None),
    ("3.0", None),
    ("1e3", None),
    ("0x10", None),
    ("1_000", None),
    ("1 000", None),
    ("\u0663", None),  # ARABIC-INDIC DIGIT THREE: not an ASCII digit
    ("\u00b2", None),  # SUPERSCRIPT TWO
    ("\x1c3", None),  # str.isspace() says space, Rust's trim does not
    ("abc", None),
    ("5abc", None),
]


@pytest.mark.parametrize(("raw", "expected"), U32_CASES)
def test_max_retries_parse_is_rusts_u32_parse(raw: str, expected: int | None) -> None:
    want = 5 if expected is None else expected
    assert AgentSettings.from_env({"RATELOOP_MAX_RETRIES": raw}).max_retries == want
    # The amplihack alias reads the same way.
    assert AgentSettings.from_env({"AMPLIHACK_RATELIMIT_MAX_RETRIES": raw}).max_retries == want


def _rust_u32(raw: str) -> int | None:
    """An independent model of ``raw.trim().parse::<u32>().ok()`` for the property below."""
    text = raw
    while text and (text[0].isspace() and text[0] not in "\x1c\x1d\x1e\x1f"):
        text = text[1:]
    while text and (text[-1].isspace() and text[-1] not in "\x1c\x1d\x1e\x1f"):
        text = text[:-1]
    digits = text[1:] if text[:1] == "+" else text
    if not digits or any(c not in "0123456789" for c in digits):
        return None
    value = int(digits)
    return value if value < 2**32 else None


@given(st.one_of(st.text(max_size=12), st.integers(-(2**40), 2**40).map(str)))
def test_max_retries_matches_the_u32_model(raw: str) -> None:
    parsed = _rust_u32(raw)
    want = 5 if parsed is None else min(parsed, 100)
    assert AgentSettings.from_env({"RATELOOP_MAX_RETRIES": raw}).max_retries == want
