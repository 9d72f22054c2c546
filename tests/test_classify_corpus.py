"""The canned-response corpus: every provider's and agent's refusals, one parametrized test.

Each ``tests/fixtures/classify/*.yaml`` file holds ``cases``.  An HTTP case
has ``status``, ``headers``, ``body`` (a mapping is sent as JSON text;
``body_dict: true`` sends it as a parsed mapping); a CLI case has ``text``
(and ``exit_code``, 1 unless given) and is read by ``classify_text`` with the
document's ``tz``.  Every case has ``expect`` (``kind``, ``retryable`` and
``retry_after`` always, plus any other ``LimitSignal`` field to check) and a
public ``source`` (its own, or the document's) saying where the message was
seen: the agent's or provider's source, documentation or an issue thread.
An MCP case has ``mcp`` (a tool result or JSON-RPC message), ``server`` and
``tool``, and is read by ``classify_mcp``.  ``pause_limit`` passes the
far-wait threshold.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from rateloop.classify import classify, classify_mcp, classify_text
from rateloop.classify._when import zone_named
from rateloop.signal import LimitSignal

FIXTURES = Path(__file__).parent / "fixtures" / "classify"
REQUIRED = ("kind", "retryable", "retry_after")


def _cases() -> list[Any]:
    params = []
    for path in sorted(FIXTURES.glob("*.yaml")):
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        now = datetime.fromisoformat(document["now"].replace("Z", "+00:00"))
        for raw in document["cases"]:
            case = {"source": document.get("source"), "tz": document.get("tz", "UTC"), **raw}
            params.append(pytest.param(case, now, id=f"{path.stem}: {case['name']}"))
    return params


CASES = _cases()


def _body(case: dict[str, Any]) -> Any:
    body = case.get("body")
    if isinstance(body, dict | list) and not case.get("body_dict"):
        return json.dumps(body)
    return body


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def _actual(signal: LimitSignal, field: str) -> Any:
    value = getattr(signal, field)
    if field == "reset_at":
        return value.isoformat() if value is not None else None
    if field == "observed":
        return [[o.dimension.value, o.limit, o.remaining, _round(o.reset_after)] for o in value]
    if hasattr(value, "value"):
        return value.value
    return value


def test_corpus_is_large_enough() -> None:
    cli = [c for c in CASES if "text" in c.values[0]]
    assert len(CASES) >= 250
    assert len(cli) >= 100


def test_every_kind_is_in_the_corpus_for_http_and_for_cli() -> None:
    http = {c.values[0]["expect"]["kind"] for c in CASES if "text" not in c.values[0]}
    cli = {c.values[0]["expect"]["kind"] for c in CASES if "text" in c.values[0]}
    every = {"temporary", "period_quota", "spend", "permission", "invalid", "overload",
             "server_error", "network", "unknown", "ok"}
    assert every - http == set()
    assert every - cli == set()


def test_every_agent_and_provider_is_in_the_corpus() -> None:
    files = {path.stem for path in FIXTURES.glob("*.yaml")}
    assert {"agents_claude", "agents_codex", "agents_copilot", "agents_gemini",
            "agents_others"} <= files
    providers = {c.values[0]["expect"].get("provider") for c in CASES}
    named = " ".join(f"{c.values[0]['name']} {c.values[0].get('source')}" for c in CASES).lower()
    for provider in ("openai", "azure", "anthropic", "google", "bedrock", "groq", "mistral",
                     "together", "xai", "cohere", "deepseek", "openrouter", "github", "slack",
                     "minimax", "zhipu", "moonshot", "cerebras", "ollama"):
        assert provider in providers or provider in named, provider


def _signal(case: dict[str, Any], now: datetime) -> LimitSignal:
    if "mcp" in case:
        return classify_mcp(case["mcp"], server=case["server"], tool=case["tool"], now=now,
                            pause_limit=case.get("pause_limit"))
    if "text" in case:
        return classify_text(
            case["text"],
            exit_code=case.get("exit_code", 1),
            now=now,
            pause_limit=case.get("pause_limit"),
            tz=zone_named(case["tz"]),
        )
    return classify(
        case.get("status"),
        case.get("headers") or {},
        _body(case),
        provider=case.get("provider"),
        now=now,
        pause_limit=case.get("pause_limit"),
    )


@pytest.mark.parametrize(("case", "now"), CASES)
def test_classify_corpus(case: dict[str, Any], now: datetime) -> None:
    expect = case["expect"]
    assert all(key in expect for key in REQUIRED), f"fixture must state {REQUIRED}"
    assert case.get("source"), "every fixture names its public source"
    signal = _signal(case, now)
    actual = {field: _actual(signal, field) for field in expect}
    expected = dict(expect)
    if expected.get("retry_after") is not None and actual["retry_after"] is not None:
        assert math.isclose(actual["retry_after"], expected["retry_after"], abs_tol=1e-6)
        actual["retry_after"] = expected["retry_after"]
    assert actual == expected


def test_an_explicit_provider_sets_the_window_of_its_headers() -> None:
    from rateloop.classify import classify

    headers = {"x-ratelimit-limit-requests": "1000", "x-ratelimit-remaining-requests": "0"}
    (groq,) = classify(429, headers, provider="groq").observed
    (openai,) = classify(429, headers, provider="openai").observed
    assert (groq.window, openai.window) == (86_400.0, 60.0)  # Groq's request limit is per day
