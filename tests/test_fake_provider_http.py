"""FakeProvider over real HTTP on 127.0.0.1, read by the real SDKs and rateloop.classify."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types as genai_types

from rateloop import Kind, classify_exception
from rateloop.testing import FakeProvider, FakeProviderServer

SRC = str(Path(__file__).resolve().parents[1] / "src")
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def server() -> Iterator[FakeProviderServer]:
    # 6 RPM, one request at a time: a slot takes 10 s to refill, so a slow machine
    # between two requests cannot make the second one pass.
    with FakeProviderServer(FakeProvider(rpm=6, tpm=100_000, burst_seconds=10)) as running:
        yield running


def test_openai_sdk_parses_the_429_with_its_headers(server: FakeProviderServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="fake", max_retries=0,
                                timeout=10)
    ok = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=20)
    assert ok.choices[0].message.content == "fake response"
    assert ok.usage is not None and ok.usage.completion_tokens == 20
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=20)
    headers = caught.value.response.headers
    # About 20 s: one slot to refill, and the one the refused request spent too.
    wait_ms = int(headers["retry-after-ms"])
    assert 15_000 < wait_ms <= 20_000
    assert headers["retry-after"] == str(math.ceil(wait_ms / 1000))
    assert headers["x-ratelimit-limit-requests"] == "6"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    signal = classify_exception(caught.value)
    assert (signal.kind, signal.dimension) == (Kind.TEMPORARY, "requests")
    # The classifier may read retry-after-ms (exact) or retry-after (rounded up).
    assert signal.retry_after is not None
    assert wait_ms / 1000 - 0.001 <= signal.retry_after <= math.ceil(wait_ms / 1000)
    assert signal.request_id is not None and signal.request_id.startswith("req_fake")
    assert server.provider.stats.attempts == 2


def test_openai_sdk_retries_on_the_fake_as_it_would_on_the_real_api() -> None:
    fake = FakeProvider(faults=["overload", "overload"])
    with FakeProviderServer(fake) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="fake", max_retries=2,
                                timeout=10)
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=5)
    assert (fake.stats.attempts, fake.stats.served) == (3, 1)
    assert fake.stats.refusals == {"overload": 2}


def test_openai_sdk_streams_and_sees_a_mid_stream_error() -> None:
    fake = FakeProvider(faults=[None, "stream_error"])
    with FakeProviderServer(fake) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="fake", max_retries=0,
                                timeout=10)
        chunks = list(client.chat.completions.create(
            model="gpt-4o-mini", messages=MESSAGES, max_tokens=5, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            "fake response"
        )
        with pytest.raises(openai.APIError):
            for _ in client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=5, stream=True
            ):
                pass


def test_anthropic_sdk_rate_limit_overload_stream_error_and_reset() -> None:
    fake = FakeProvider(profile="anthropic", rpm=6, burst_seconds=10,
                        faults=[None, None, "overload", "stream_error", "reset"])
    with FakeProviderServer(fake) as running:
        client = anthropic.Anthropic(base_url=running.url, api_key="fake", max_retries=0,
                                timeout=10)
        message = client.messages.create(model="claude-x", max_tokens=10, messages=MESSAGES)
        assert message.usage.output_tokens == 10
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model="claude-x", max_tokens=10, messages=MESSAGES)
        assert 15 < int(limited.value.response.headers["retry-after"]) <= 20
        assert limited.value.response.headers["anthropic-ratelimit-requests-limit"] == "6"
        assert classify_exception(limited.value).dimension == "requests"
        fake.reset()  # full buckets; the fault script goes on
        with pytest.raises(anthropic.APIStatusError) as overloaded:
            client.messages.create(model="claude-x", max_tokens=10, messages=MESSAGES)
        assert overloaded.value.status_code == 529
        assert overloaded.value.response.headers["x-should-retry"] == "true"
        assert classify_exception(overloaded.value).kind is Kind.OVERLOAD
        with pytest.raises(anthropic.APIStatusError) as broken, client.messages.stream(
            model="claude-x", max_tokens=10, messages=MESSAGES
        ) as stream:
            stream.get_final_message()
        assert classify_exception(broken.value).kind is Kind.OVERLOAD
        with pytest.raises(anthropic.APIConnectionError) as reset:
            client.messages.create(model="claude-x", max_tokens=10, messages=MESSAGES)
        assert classify_exception(reset.value).kind is Kind.NETWORK


def test_gemini_client_reads_resource_exhausted_and_the_day_quota() -> None:
    fake = FakeProvider(profile="gemini", rpm=6, burst_seconds=10)
    with FakeProviderServer(fake) as running:
        client = genai.Client(api_key="fake",
                              http_options=genai_types.HttpOptions(base_url=running.url,
                                                                     timeout=10_000))
        answer = client.models.generate_content(model="gemini-2.5-flash", contents="hello")
        assert answer.text == "fake response"
        with pytest.raises(Exception) as limited:
            client.models.generate_content(model="gemini-2.5-flash", contents="hello")
        signal = classify_exception(limited.value)
        assert (signal.kind, signal.dimension) == (Kind.TEMPORARY, "requests")
        fake.reset()
        fake.exhaust_day()
        with pytest.raises(Exception) as daily:
            client.models.generate_content(model="gemini-2.5-flash", contents="hello")
        assert classify_exception(daily.value).kind is Kind.PERIOD_QUOTA


def test_gemini_client_streams_and_sees_a_mid_stream_error() -> None:
    fake = FakeProvider(profile="gemini", faults=[None, "stream_error"])
    with FakeProviderServer(fake) as running:
        client = genai.Client(api_key="fake",
                              http_options=genai_types.HttpOptions(base_url=running.url,
                                                                   timeout=10_000))
        chunks = client.models.generate_content_stream(model="gemini-2.5-flash",
                                                       contents="hello")
        assert [c.text for c in chunks] == ["fake response"]
        with pytest.raises(Exception) as broken:
            list(client.models.generate_content_stream(model="gemini-2.5-flash",
                                                       contents="hello"))
        assert classify_exception(broken.value).kind is Kind.OVERLOAD
    assert fake.stats.refusals == {"stream_error": 1}


def test_stats_endpoint_and_keep_alive(server: FakeProviderServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        for _ in range(3):
            client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1})
        stats = client.get("/fake/stats").json()
        assert (stats["attempts"], stats["served"]) == (3, 1)
        assert stats["config"]["limits"]["rpm"] == 6
        assert client.post("/fake/reset").json() == {"reset": True}
    assert server.provider.stats.attempts == 0


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC}


def test_pytest_fixture_is_one_line_in_a_users_test(tmp_path: Path) -> None:
    test_file = tmp_path / "test_user.py"
    test_file.write_text(textwrap.dedent("""
        import httpx
        import pytest

        @pytest.mark.fake_provider(profile="anthropic", rpm=2, burst_seconds=30)
        def test_mine(fake_provider):
            url = fake_provider.url + "/v1/messages"
            body = {"model": "m", "max_tokens": 5, "messages": []}
            codes = [httpx.post(url, json=body).status_code for _ in range(3)]
            assert codes == [200, 429, 429]
            assert fake_provider.provider.stats.refusals["requests"] == 2

        def test_default(fake_provider):
            assert fake_provider.url.startswith("http://127.0.0.1:")
    """))
    # -p no:rateloop: the entry point may or may not be installed; load the module by name.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:rateloop", "-p",
         "rateloop.testing.pytest_plugin", "-p", "no:cacheprovider", str(test_file)],
        cwd=tmp_path, check=False, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_cli_serves_until_stopped() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "rateloop", "fake-provider", "--port", "0", "--rpm", "1",
         "--profile", "anthropic"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            banner = proc.stdout.readline()
            assert "listening on http://127.0.0.1:" in banner, banner
            url = banner.rsplit(" ", 1)[-1].strip()
            body = {"model": "m", "max_tokens": 5, "messages": []}
            codes = [httpx.post(url + "/v1/messages", json=body, timeout=10).status_code
                     for _ in range(2)]
            assert codes == [200, 429]
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_cli_on_a_taken_port_says_so() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "rateloop", "fake-provider", "--port", str(port)],
            check=False, env=_env(), capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.startswith(f"rateloop fake-provider: cannot listen on 127.0.0.1:{port}: ")
    assert "address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_passes_the_refusal_options() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "rateloop", "fake-provider", "--port", "0", "--rpm", "1",
         "--burst", "60", "--no-rejected-spends-request", "--output-ratio", "0.5"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().rsplit(" ", 1)[-1].strip()
            body = {"model": "m", "max_tokens": 10, "messages": []}
            first = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert first.json()["usage"]["completion_tokens"] == 5  # half of max_tokens
            second = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert second.status_code == 429
            stats = httpx.get(url + "/fake/stats", timeout=10).json()
            assert stats["config"]["rejected_spends_request"] is False
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_cli_rejects_bad_options() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rateloop", "fake-provider", "--rpm", "-1"],
        check=False, env=_env(), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "rpm must be an integer >= 1" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "rateloop", "fake-provider", "--fault-rate", "boom=1"],
        check=False, env=_env(), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "NAME one of rate_limit" in done.stderr


def test_a_fault_in_the_app_answers_500_instead_of_hanging(
    server: FakeProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(server.provider, "_open", broken)
    response = httpx.post(server.url + "/v1/messages", json={"max_tokens": 1}, timeout=10)
    assert response.status_code == 500
    assert response.text == "fake provider error: RuntimeError"
