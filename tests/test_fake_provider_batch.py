"""The FakeProvider's batch endpoints over real HTTP, driven by the real openai and anthropic SDKs.

Every batch runs on the provider's FakeClock: the test moves time, no test sleeps.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from rateloop.testing import FakeBatch, FakeClock, FakeProvider, FakeProviderServer

CHAT = "/v1/chat/completions"


def _line(custom_id: str, *, words: int = 4, max_tokens: int = 10, model: str = "gpt-x") -> str:
    body = {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "word " * words}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def _request(custom_id: str, *, max_tokens: int = 10) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": {
        "model": "claude-x", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello"}]}}


class Desk:
    """A running fake with its clock and both SDK clients."""

    def __init__(self, batch: FakeBatch) -> None:
        self.clock = FakeClock()
        self.fake = FakeProvider(batch=batch, output_ratio=0.5, clock=self.clock)
        self.server = FakeProviderServer(self.fake).start()
        self.openai = openai.OpenAI(base_url=self.server.url + "/v1", api_key="fake",
                                    max_retries=0, timeout=10)
        self.anthropic = anthropic.Anthropic(base_url=self.server.url, api_key="fake",
                                             max_retries=0, timeout=10)

    def submit(self, lines: list[str]) -> Any:
        upload = self.openai.files.create(
            file=("input.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
        assert (upload.purpose, upload.object) == ("batch", "file")
        return self.openai.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                          completion_window="24h")

    def retrieve(self, batch_id: str) -> Any:
        return self.openai.batches.retrieve(batch_id)

    def lines(self, file_id: str | None) -> dict[str, dict[str, Any]]:
        if file_id is None:
            return {}
        text = self.openai.files.content(file_id).text
        return {row["custom_id"]: row for row in map(json.loads, text.splitlines())}


@pytest.fixture
def desk(request: pytest.FixtureRequest) -> Iterator[Desk]:
    running = Desk(FakeBatch(**getattr(request, "param", {})))
    try:
        yield running
    finally:
        running.server.stop()


def _batch(**kwargs: Any) -> pytest.MarkDecorator:
    """Run the test on a desk whose batches behave as ``FakeBatch(**kwargs)``."""
    return pytest.mark.parametrize("desk", [kwargs], indirect=True, ids=["batch"])


@_batch(validation_seconds=2, delay=60, item_seconds=10, finalizing_seconds=5,
        fail_ids={"boom"}, context_window=500, max_output_tokens=100)
def test_openai_batch_lifecycle_results_and_per_item_failures(desk: Desk) -> None:
    lines = [_line("a"), _line("boom"), _line("long", words=2000), _line("greedy",
                                                                         max_tokens=200),
             _line("b")]
    batch = desk.submit(lines)
    assert (batch.status, batch.model, batch.request_counts.total) == ("validating", "gpt-x", 5)
    assert batch.expires_at == batch.created_at + 86_400
    desk.clock.advance(2 + 60 + 10)  # the first two items are done
    running = desk.retrieve(batch.id)
    assert running.status == "in_progress" and running.in_progress_at == batch.created_at + 2
    assert (running.request_counts.completed, running.request_counts.failed) == (1, 1)
    assert running.output_file_id is None
    desk.clock.advance(30)  # the last item finishes at 2 + 60 + 40
    assert desk.retrieve(batch.id).status == "finalizing"
    desk.clock.advance(5)
    done = desk.retrieve(batch.id)
    assert done.status == "completed" and done.completed_at == batch.created_at + 107
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 3)
    output, errors = desk.lines(done.output_file_id), desk.lines(done.error_file_id)
    assert sorted(output) == ["a", "b"] and sorted(errors) == ["boom", "greedy", "long"]
    body = output["a"]["response"]["body"]
    assert output["a"]["response"]["status_code"] == 200 and output["a"]["error"] is None
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 5
    assert errors["boom"]["response"]["status_code"] == 500
    too_long = errors["long"]["response"]
    assert too_long["status_code"] == 400
    assert too_long["body"]["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 500 tokens" in too_long["body"]["error"]["message"]
    greedy = errors["greedy"]["response"]["body"]["error"]
    assert (greedy["param"], greedy["code"]) == ("max_tokens", "invalid_value")
    assert desk.fake.stats.batches == 1
    assert desk.fake.stats.batch_items == {"succeeded": 2, "errored": 3}


@_batch(fail_rate=0.5)
def test_openai_fail_rate_is_drawn_from_the_seed(desk: Desk) -> None:
    batch = desk.submit([_line(f"r{i}") for i in range(40)])
    desk.clock.advance(120)
    done = desk.retrieve(batch.id)
    failed = done.request_counts.failed
    assert 10 < failed < 30 and done.request_counts.completed == 40 - failed
    # The same seed draws the same failures.
    clock = FakeClock()
    again = FakeProvider(batch=FakeBatch(fail_rate=0.5), clock=clock)
    with FakeProviderServer(again) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="fake", max_retries=0)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(
            "\n".join(_line(f"r{i}") for i in range(40)).encode())), purpose="batch")
        twin = client.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                     completion_window="24h")
        clock.advance(120)
        assert client.batches.retrieve(twin.id).request_counts.failed == failed


@pytest.mark.parametrize(
    ("bad", "code", "line"),
    [
        ("{not json", "invalid_json_line", 2),
        (_line("a"), "duplicate_custom_id", 2),
        (_line("c", model="gpt-other"), "model_mismatch", 2),
        (json.dumps({"custom_id": "d", "method": "POST", "url": "/v1/embeddings", "body": {}}),
         "url_mismatch", 2),
    ],
)
def test_openai_validates_the_file_as_a_whole(desk: Desk, bad: str, code: str, line: int) -> None:
    batch = desk.submit([_line("a"), bad, _line("b")])
    assert batch.status == "validating"
    desk.clock.advance(1)
    failed = desk.retrieve(batch.id)
    assert failed.status == "failed" and failed.failed_at == batch.created_at + 1
    assert failed.errors is not None and failed.errors.data is not None
    [error] = failed.errors.data
    assert (error.code, error.line) == (code, line)
    if code == "invalid_json_line":
        assert error.message == "This line is not parseable as valid JSON."
    assert failed.output_file_id is None and failed.error_file_id is None


@_batch(enqueued_tokens=100, delay=60)
def test_openai_refuses_a_batch_over_the_enqueued_token_limit(desk: Desk) -> None:
    # 160 words of 5 characters are 200 tokens (one per 4 characters): over the limit alone.
    first = desk.submit([_line("a", words=160)])
    assert first.status == "validating"
    desk.clock.advance(1)
    failed = desk.retrieve(first.id)
    assert failed.status == "failed"
    [error] = failed.errors.data  # type: ignore[union-attr]
    assert error.code == "token_limit_exceeded"
    assert error.message == (
        "Enqueued token limit reached for gpt-x in organization org-fake. Limit: 100 enqueued "
        "tokens. Please try again once some in_progress batches have been completed.")


@_batch(enqueued_tokens=100, delay=60)
def test_the_enqueued_tokens_free_up_when_a_batch_ends(desk: Desk) -> None:
    small = [_line("a", words=24), _line("b", words=24)]  # 30 tokens each: 60 enqueued
    first = desk.submit(small)
    second = desk.submit(small)  # 120 in flight would pass the limit
    desk.clock.advance(1)
    assert desk.retrieve(first.id).status == "in_progress"
    assert desk.retrieve(second.id).status == "failed"
    desk.clock.advance(61)
    assert desk.retrieve(first.id).status == "completed"
    third = desk.submit(small)
    desk.clock.advance(1)
    assert desk.retrieve(third.id).status == "in_progress"


@_batch(delay=50, item_seconds=30, completion_window=100)
def test_an_openai_batch_expires_with_its_finished_items(desk: Desk) -> None:
    batch = desk.submit([_line(f"r{i}") for i in range(4)])  # done at 51, 81, 111, 141
    desk.clock.advance(99)
    assert desk.retrieve(batch.id).status == "in_progress"
    desk.clock.advance(1)
    expired = desk.retrieve(batch.id)
    assert expired.status == "expired" and expired.expired_at == batch.created_at + 100
    assert sorted(desk.lines(expired.output_file_id)) == ["r0", "r1"]
    late = desk.lines(expired.error_file_id)
    assert sorted(late) == ["r2", "r3"]
    assert late["r2"]["response"] is None and late["r2"]["error"] == {
        "code": "batch_expired",
        "message": "This request could not be executed before the completion window expired."}
    assert desk.fake.stats.batch_items == {"succeeded": 2, "expired": 2}


@_batch(delay=10, item_seconds=10, finalizing_seconds=3)
def test_an_openai_batch_cancelled_midway_keeps_what_finished(desk: Desk) -> None:
    batch = desk.submit([_line(f"r{i}") for i in range(4)])  # done at 11, 21, 31, 41
    desk.clock.advance(25)
    cancelling = desk.openai.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at == batch.created_at + 25
    desk.clock.advance(3)
    cancelled = desk.retrieve(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at == batch.created_at + 28
    assert sorted(desk.lines(cancelled.output_file_id)) == ["r0", "r1"]
    assert cancelled.error_file_id is None


def test_openai_unknown_ids_and_bad_requests_are_clear_errors(desk: Desk) -> None:
    with pytest.raises(openai.NotFoundError, match="batch_nope"):
        desk.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError, match="file-nope"):
        desk.openai.files.content("file-nope")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        desk.openai.batches.create(input_file_id="file-x", endpoint=CHAT,
                                   completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="purpose must be 'batch'"):
        desk.openai.files.create(file=("a.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")


@_batch(delay=30, item_seconds=10, fail_ids={"boom"}, max_output_tokens=100)
def test_anthropic_batch_lifecycle_and_results(desk: Desk) -> None:
    requests = [_request("a"), _request("boom"), _request("greedy", max_tokens=500),
                {"custom_id": "odd", "params": {"model": "claude-x", "max_tokens": "ten"}}]
    batch = desk.anthropic.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 4 and batch.results_url is None
    desk.clock.advance(50)  # three done: the counts wait for the end
    running = desk.anthropic.messages.batches.retrieve(batch.id)
    assert (running.processing_status, running.request_counts.processing) == ("in_progress", 4)
    early = httpx.get(f"{desk.server.url}/v1/messages/batches/{batch.id}/results", timeout=10)
    assert early.status_code == 400 and "has not ended" in early.text
    desk.clock.advance(10)
    ended = desk.anthropic.messages.batches.retrieve(batch.id)
    assert ended.processing_status == "ended" and ended.ended_at is not None
    counts = ended.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (1, 3, 0)
    results = {r.custom_id: r.result for r in desk.anthropic.messages.batches.results(batch.id)}
    assert results["a"].type == "succeeded"
    assert results["a"].message.usage.output_tokens == 5  # type: ignore[union-attr]
    errors = {k: v.error.error for k, v in results.items() if v.type == "errored"}  # type: ignore[union-attr]
    assert errors["boom"].type == "api_error"
    assert errors["greedy"].type == "invalid_request_error"
    assert errors["greedy"].message == (
        "max_tokens: 500 > 100, which is the maximum allowed number of output tokens for "
        "claude-x")
    assert "max_tokens must be an integer" in errors["odd"].message


@_batch(delay=10, item_seconds=10, completion_window=25)
def test_anthropic_batch_expires_and_cancels(desk: Desk) -> None:
    batches = desk.anthropic.messages.batches
    expiring = batches.create(requests=[_request(f"r{i}") for i in range(3)])  # type: ignore[list-item]
    cancelled = batches.create(requests=[_request(f"c{i}") for i in range(3)])  # type: ignore[list-item]
    desk.clock.advance(15)
    canceling = batches.cancel(cancelled.id)
    assert canceling.processing_status == "canceling"
    assert canceling.cancel_initiated_at is not None
    desk.clock.advance(10)
    assert batches.retrieve(expiring.id).request_counts.expired == 1
    kinds = {r.custom_id: r.result.type for r in batches.results(expiring.id)}
    assert kinds == {"r0": "succeeded", "r1": "succeeded", "r2": "expired"}
    kinds = {r.custom_id: r.result.type for r in batches.results(cancelled.id)}
    assert kinds == {"c0": "succeeded", "c1": "canceled", "c2": "canceled"}


def test_anthropic_malformed_batches_and_unknown_ids(desk: Desk) -> None:
    batches = desk.anthropic.messages.batches
    with pytest.raises(anthropic.BadRequestError, match="unique"):
        batches.create(requests=[_request("a"), _request("a")])  # type: ignore[list-item]
    with pytest.raises(anthropic.BadRequestError, match="custom_id"):
        batches.create(requests=[_request("has space")])  # type: ignore[list-item]
    with pytest.raises(anthropic.NotFoundError):
        batches.retrieve("msgbatch_nope")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"delay": -1}, "FakeBatch.delay must be a number of seconds >= 0, got -1"),
        ({"completion_window": 0}, "completion_window must be a number of seconds > 0"),
        ({"fail_rate": 2}, "fail_rate must be a probability 0..1, got 2"),
        ({"fail_ids": "abc"}, "fail_ids must be a set of custom_id strings"),
        ({"enqueued_tokens": 0}, "enqueued_tokens must be an integer >= 1 or None"),
    ],
)
def test_bad_batch_settings_are_clear_errors(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        FakeBatch(**kwargs)


def test_the_sync_handler_serves_the_batch_endpoints_too() -> None:
    clock = FakeClock()
    fake = FakeProvider(batch=FakeBatch(delay=5), clock=clock)
    with httpx.Client(transport=httpx.MockTransport(fake.handler),
                      base_url="http://fake") as client:
        created = client.post("/v1/messages/batches", json={"requests": [_request("a")]})
        assert created.status_code == 200
        batch_id = created.json()["id"]
        clock.advance(5)
        assert client.get(f"/v1/messages/batches/{batch_id}").json()["processing_status"] == (
            "ended")
        results = client.get(f"/v1/messages/batches/{batch_id}/results")
        [line] = [json.loads(row) for row in results.text.splitlines()]
        assert (line["custom_id"], line["result"]["type"]) == ("a", "succeeded")
        assert client.get("/v1/batches/batch_nope").status_code == 404


@_batch()
def test_both_lists_page_newest_first_with_openai_metadata(desk: Desk) -> None:
    upload = desk.openai.files.create(file=("in.jsonl", io.BytesIO(_line("a").encode())),
                                      purpose="batch")
    made = [desk.openai.batches.create(input_file_id=upload.id, endpoint=CHAT,
                                       completion_window="24h", metadata={"key": f"k{i}"})
            for i in range(3)]
    first = desk.openai.batches.list(limit=2)
    assert [b.id for b in first.data] == [made[2].id, made[1].id] and first.has_more
    assert [b.metadata for b in first.data] == [{"key": "k2"}, {"key": "k1"}]
    rest = desk.openai.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == [made[0].id] and not rest.has_more
    assert [b.id for b in desk.openai.batches.list(limit=2)] == [b.id for b in made[::-1]]

    sent = [desk.anthropic.messages.batches.create(requests=[_request(f"r{i}")])  # type: ignore[list-item]
            for i in range(3)]
    page = desk.anthropic.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == [sent[2].id, sent[1].id] and page.has_more
    older = desk.anthropic.messages.batches.list(limit=2, after_id=page.last_id)
    assert [b.id for b in older.data] == [sent[0].id] and not older.has_more
    assert desk.fake.stats.batches == 6  # listing creates nothing

    raw = httpx.get(desk.server.url + "/v1/batches?limit=0")
    assert raw.status_code == 400 and "from 1 to 100" in raw.json()["error"]["message"]
    raw = httpx.get(desk.server.url + "/v1/messages/batches?after_id=nope")
    assert raw.status_code == 400 and "'nope'" in raw.json()["error"]["message"]
