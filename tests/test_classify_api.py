"""The public surface of rateloop.classify, and that docs/classify.md keeps up with it."""

from __future__ import annotations

import http.client
import importlib
import io
from datetime import UTC, datetime
from pathlib import Path

from rateloop.classify import PROVIDERS, RESET_FIELDS, classify, detect_provider
from rateloop.signal import Kind

# The attribute `rateloop.classify` is the function (exported at top level); the
# package is reached through the import system.
classify_module = importlib.import_module("rateloop.classify")

DOC = (Path(__file__).resolve().parents[1] / "docs" / "classify.md").read_text(encoding="utf-8")


def test_all_is_sorted_and_complete() -> None:
    assert classify_module.__all__ == sorted(classify_module.__all__)
    for name in ("classify", "classify_exception", "classify_response", "classify_text",
                 "detect_provider"):
        assert name in classify_module.__all__
        assert callable(getattr(classify_module, name))


def test_docs_list_every_reset_field_kind_and_provider() -> None:
    missing = [f for f in RESET_FIELDS if f"`{f}`" not in DOC]
    missing += [k.value for k in Kind if f"| `{k.value}` |" not in DOC]
    missing += [p for p in PROVIDERS if f"`{p}`" not in DOC]
    assert missing == []


def test_docs_list_every_agent_message_and_trap_the_corpus_recognises() -> None:
    """Each ``matched`` phrase of the agent and trap fixtures appears in the docs page."""
    import yaml

    fixtures = Path(__file__).parent / "fixtures" / "classify"
    missing = set()
    for path in [*fixtures.glob("agents_*.yaml"), fixtures / "traps.yaml"]:
        for case in yaml.safe_load(path.read_text(encoding="utf-8"))["cases"]:
            matched = case["expect"].get("matched")
            if matched and not matched.isdigit() and matched not in DOC:
                missing.add(matched)
    assert sorted(missing) == []


def test_detect_provider_from_headers_and_body() -> None:
    assert detect_provider({"Anthropic-Ratelimit-Requests-Limit": "50"}, None) == "anthropic"
    assert detect_provider([("X-Amzn-ErrorType", "ThrottlingException:x")], b"") == "bedrock"
    assert detect_provider({}, '{"error": {"status": "RESOURCE_EXHAUSTED"}}') == "google"
    assert detect_provider({}, {"type": "error", "error": {"type": "overloaded_error"}}) == (
        "anthropic"
    )
    assert detect_provider({"x-groq-region": "us"}, None) == "groq"
    assert detect_provider({}, "plain text") is None
    assert detect_provider(None, None) is None


def test_headers_from_http_client_message() -> None:
    message = http.client.parse_headers(io.BytesIO(b"Retry-After: 5\r\nRequest-Id: r1\r\n\r\n"))
    signal = classify(429, message, None, now=datetime(2026, 1, 1, tzinfo=UTC))  # type: ignore[arg-type]
    assert (signal.retry_after, signal.request_id) == (5.0, "r1")
