"""One redact function for every secret shape, everywhere rateloop prints or raises."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rateloop._redact import redact, redact_url
from rateloop.admission import Limiter
from rateloop.admission.backends import BackendUnreachable
from rateloop.errors import BackendError, ConfigError, RateLimitExhausted
from rateloop.outcome import Outcome, Status
from rateloop.route import Cost, Route


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("redis://u:s3cret@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://:s3cret@h/0", "redis://:***@h/0"),
        ("rediss://u:p@ss@h:1/0", "rediss://u:***@h:1/0"),
        ("redis://h/0?password=s3cret&db=1", "redis://h/0?password=***&db=1"),
        ("redis://h/0?db=1&PASSWORD=s3cret", "redis://h/0?db=1&PASSWORD=***"),
        ("unix://:s3cret@/tmp/r.sock?db=0", "unix://:***@/tmp/r.sock?db=0"),
        ("host=db password=s3cret dbname=t", "host=db password=*** dbname=t"),
        ("at redis://a:s3cret@c then", "at redis://a:***@c then"),
        ("key sk-proj-abcdefghijklmnop", "key [redacted]"),
        ("Authorization: Bearer abc.def", "Authorization: [redacted]"),
        # Nothing secret: unchanged.
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("memory://", "memory://"),
        ("postgresql://postgres@127.0.0.1:5432/test", "postgresql://postgres@127.0.0.1:5432/test"),
        ("openai:gpt-4.1:proj-1", "openai:gpt-4.1:proj-1"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact_url(text) == expected


QUERY = "redis://127.0.0.1:1/0?password=s3cretpw"


def test_the_limiter_repr_and_an_unreachable_backend_hide_the_password() -> None:
    limiter = Limiter.from_url(QUERY, socket_connect_timeout=1)
    try:
        assert "s3cretpw" not in repr(limiter)
        with pytest.raises(BackendUnreachable) as info:  # port 1: refused, no server needed
            limiter.try_reserve(Route(provider="openai", model="m"), Cost())
        assert "s3cretpw" not in str(info.value)
    finally:
        limiter.close()


def test_an_unknown_backend_scheme_does_not_echo_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        Limiter.from_url("foo://u:s3cretpw@h/0")
    assert "s3cretpw" not in str(info.value)


def test_errors_redact_what_they_are_given() -> None:
    assert "s3cret" not in str(BackendError("Redis at redis://:s3cret@h/0 is down"))
    err = ConfigError("bad", key="k", value="redis://u:s3cret@h/0")
    assert "s3cret" not in str(err) and "s3cret" not in str(err.value)
    outcome = Outcome(status=Status.REJECTED, reason="refused by redis://u:s3cret@h/0")
    assert "s3cret" not in str(RateLimitExhausted(outcome))


@settings(max_examples=300, deadline=None)
@given(
    password=st.text(
        alphabet=st.characters(whitelist_categories=("Lu", "Ll", "Nd"), max_codepoint=127),
        min_size=6,
        max_size=30,
    ),
    form=st.sampled_from(
        [
            "redis://user:{p}@127.0.0.1:6379/0",
            "redis://:{p}@127.0.0.1:6379/0",
            "rediss://127.0.0.1:6379/0?password={p}",
            "redis://127.0.0.1:6379/0?db=1&password={p}",
            "text before redis://u:{p}@h/0 and after",
        ]
    ),
)
def test_no_url_password_survives(password: str, form: str) -> None:
    assume(password not in form.replace("{p}", "***"))  # not a word of the URL itself
    assert password not in redact(form.format(p=password))
