"""A ``rateloop worker --app`` for the batch crash tests: batch steps on the FakeProvider.

``batch_digest`` is one :class:`BatchStep`; ``rung_digest`` one model call whose
ladder hands it to the batch rung (its ``BatchRung``).  Their provider kills its
own worker (SIGKILL) right after its first submission reached the fake and
before the step checkpointed the batch id: the worst moment.  The marker file
says it already did, so the next worker goes on.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx

from rateloop.route import Route
from rateloop.tasks import StepContext, task
from rateloop.tasks.batch import AnthropicBatches, BatchSettings, BatchStep, OpenAIBatches
from rateloop.tasks.batch_rung import BatchRung

URL = os.environ["RATELOOP_BATCH_FAKE_URL"]
MARK = Path(os.environ["RATELOOP_BATCH_CRASH_MARK"])
FLAVOR = os.environ["RATELOOP_BATCH_FLAVOR"]


class KillAfterSubmit:
    def __init__(self, inner: Any) -> None:
        self.inner, self.name = inner, inner.name

    def submit(self, *args: Any) -> str:
        batch_id: str = self.inner.submit(*args)
        if not MARK.exists():
            MARK.write_text(batch_id)
            os.kill(os.getpid(), signal.SIGKILL)
        return batch_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


inner = (OpenAIBatches if FLAVOR == "openai" else AnthropicBatches)(
    api_key="sk-fake", base_url=URL, timeout=10)
digest = task("batch_digest")
digest.step("batch")(BatchStep(
    provider=KillAfterSubmit(inner), route=Route(provider=FLAVOR, model="m", project="p"),
    items=lambda ctx: ctx.args["items"],
    settings=BatchSettings(first_poll_secs=0.2, max_poll_secs=0.5)))


def summarise(ctx: StepContext, route: Route) -> Any:
    """The step's synchronous call (the standard rung)."""
    path = "/v1/chat/completions" if FLAVOR == "openai" else "/v1/messages"
    with httpx.Client(base_url=URL, timeout=10) as http:
        answer = http.post(path, json=ctx.args["body"])
    answer.raise_for_status()
    return answer.json()


rung_digest = task("rung_digest")
rung_digest.step("summarise", route=Route(provider=FLAVOR, model="m", project="p"),
                 batch=BatchRung(provider=KillAfterSubmit(inner),
                                 request=lambda ctx, route: ctx.args["body"],
                                 settings=BatchSettings(first_poll_secs=0.2, max_poll_secs=0.5)),
                 )(summarise)
