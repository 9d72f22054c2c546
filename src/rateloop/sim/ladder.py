"""``rateloop simulate --scenario ladder``: bulk work beside interactive calls, three ways.

How it works.  One model (``sim-big``) whose standard tier cannot serve both
the interactive stream and the bulk job in time, a flex tier of its own
capacity, OpenAI-shaped batch endpoints, and a smaller model (``sim-small``)
as the fallback: two :class:`~rateloop.testing.FakeProvider` s on virtual
time.  The same work meets each strategy:

- ``interactive``: a call every ``interactive_every`` seconds until the bulk
  deadline, each with a user's deadline (``interactive_deadline``); a call
  that ends unanswered is lost (its user got an error);
- ``bulk``: ``bulk_calls`` calls (priority ``background``, deferrable), all
  due by ``deadline_secs``, run by a pool of ``bulk_workers`` (a worker pool
  or a task queue's workers: never a thousand coroutines at once).

The strategies, all with the real :class:`~rateloop.AsyncRateLoop` and one
shared :class:`~rateloop.admission.Limiter` told the standard limits:

- ``standard``: every call on the standard tier, nothing else;
- ``fallback``: the standard tier, then the smaller model (the loop's
  fallback, for both classes);
- ``ladder``: the policy's ``[ladder]``: interactive ``standard, fallback``;
  background ``standard, flex, batch, fallback, park``, which a deferrable
  class walks ``flex, standard, batch`` (docs/ladder.md).

A call that ends ``waiting_for_capacity`` / ``waiting_for_reset`` with a time
to retry (parked) is put back on the bulk queue then, as the task queue
would.  The **batch rung** is modelled in the simulator, not through the
durable task store: what reaches it is collected for ``batch_collect_secs``
and submitted to the fake's OpenAI batch endpoints (a JSONL file, a batch),
polled with the batch step's backoff (:class:`~rateloop.tasks.batch.BatchSettings`),
and each item mapped back: a success is done (priced at the batch discount
from its ``usage``), a 5xx or an expired item goes again in the next batch (at
most ``max_rounds``), a 4xx fails.  Past the deadline, unfinished bulk work
still runs (late), so the table shows when it ended.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rateloop.admission import Limiter, LimitSpec
from rateloop.loop.drivers import AsyncRateLoop
from rateloop.outcome.record import Outcome
from rateloop.policy import LadderPolicy, Policy
from rateloop.route import Cost, Route
from rateloop.sim.report import duration
from rateloop.sim.vtime import VirtualClock, run_virtual
from rateloop.tasks.batch import BatchSettings
from rateloop.testing import FakeBatch, FakeLimits, FakeProvider, FakeRequest, FakeResponse

__all__ = [
    "LADDER_NOTE",
    "LADDER_STRATEGIES",
    "LadderResult",
    "LadderScenario",
    "render_ladder",
    "run_ladder",
]

#: The strategies the ladder table compares: name -> label.
LADDER_STRATEGIES: dict[str, str] = {
    "standard": "standard only",
    "fallback": "standard + fallback",
    "ladder": "ladder",
}

LADDER_NOTE = (
    "Virtual time: the same seed gives the same table. The batch rung is modelled in the "
    "simulator (the fake's OpenAI batch endpoints, in process), not through the durable "
    "task store."
)

_BIG, _SMALL = "sim-big", "sim-small"
_ENDED = ("completed", "expired", "cancelled", "failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class LadderScenario:
    """The ladder scenario's provider, prices and work (the defaults are the README's table)."""

    bulk_calls: int = 1000
    bulk_workers: int = 16
    deadline_secs: float = 6 * 3600.0
    interactive_every: float = 30.0
    interactive_deadline: float = 60.0
    standard: FakeLimits = field(default_factory=lambda: FakeLimits(rpm=4, tpm=40_000))
    flex: FakeLimits = field(default_factory=lambda: FakeLimits(rpm=3, tpm=20_000))
    small: FakeLimits = field(default_factory=lambda: FakeLimits(rpm=4, tpm=40_000))
    batch: FakeBatch = field(default_factory=lambda: FakeBatch(
        delay=1800.0, item_seconds=2.0, fail_rate=0.05))
    latency: float = 4.0
    flex_latency: float = 6.0  # flex answers slower
    bulk_tokens: tuple[int, int, int] = (2000, 600, 400)  # input, max output, output
    interactive_tokens: tuple[int, int, int] = (800, 400, 250)
    big_prices: tuple[float, float] = (2.0, 8.0)  # USD per million input / output tokens
    small_prices: tuple[float, float] = (0.4, 1.6)
    reserve: float = 0.2  # admission keeps this share free for each class above
    batch_collect_secs: float = 60.0
    transit: float = 0.01

    def __post_init__(self) -> None:
        for name in ("bulk_calls", "bulk_workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LadderScenario.{name} must be an integer >= 1, got {value!r}")
        for name in ("deadline_secs", "interactive_every", "interactive_deadline",
                     "batch_collect_secs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"LadderScenario.{name} must be a number of seconds > 0, "
                                 f"got {value!r}")

    @property
    def interactive_calls(self) -> int:
        return math.ceil(self.deadline_secs / self.interactive_every)

    def lines(self) -> list[str]:
        """The header above the table: the work, the limits, the prices."""
        std, flex, small = self.standard, self.flex, self.small
        return [
            f"ladder: {self.bulk_calls:,} bulk calls (background, deferrable, "
            f"{self.bulk_workers} workers) due in {_hours(self.deadline_secs)},",
            f"beside an interactive call every {self.interactive_every:g} s (each with a "
            f"{self.interactive_deadline:g} s deadline)",
            f"{_BIG}: standard {std.rpm} RPM; flex {flex.rpm} RPM ("
            f"{self.latency + self.flex_latency:g} s answers, not {self.latency:g}); batch "
            f"results in {self.batch.delay / 60:g} min, {self.batch.fail_rate:.0%} fail",
            f"{_SMALL}, the fallback: {small.rpm} RPM",
            f"prices per Mtok in/out: {_BIG} ${self.big_prices[0]:g}/${self.big_prices[1]:g} "
            f"(flex and batch: half), {_SMALL} ${self.small_prices[0]:g}/"
            f"${self.small_prices[1]:g}",
        ]


@dataclass(slots=True)
class LadderResult:
    """What one strategy did with the ladder scenario."""

    strategy: str
    cost_usd: float
    bulk_done: int
    bulk_calls: int
    bulk_done_by_deadline: int
    bulk_finished: float | None  # virtual seconds until the last bulk call was answered
    interactive_latencies: list[float]
    interactive_calls: int
    refusals: int
    successes: int
    lost: int
    batches: int = 0  # batches submitted to the provider's batch endpoints
    bulk_on: Counter[str] = field(default_factory=Counter)  # rung -> bulk calls answered there

    def interactive_p95(self) -> float | None:
        done = sorted(self.interactive_latencies)
        if not done:
            return None
        return done[min(len(done) - 1, max(0, math.ceil(0.95 * len(done)) - 1))]

    @property
    def refusals_per_success(self) -> float:
        return self.refusals / self.successes if self.successes else math.inf

    def summary(self) -> dict[str, Any]:
        """The row as JSON-ready numbers."""
        rps = self.refusals_per_success
        return {
            "scenario": "ladder",
            "strategy": self.strategy,
            "cost_usd": round(self.cost_usd, 4),
            "bulk_done": self.bulk_done,
            "bulk_calls": self.bulk_calls,
            "bulk_done_by_deadline": self.bulk_done_by_deadline,
            "bulk_finished_secs": None if self.bulk_finished is None
            else round(self.bulk_finished, 3),
            "interactive_p95_secs": self.interactive_p95(),
            "interactive_answered": len(self.interactive_latencies),
            "interactive_calls": self.interactive_calls,
            "refusals_per_success": None if math.isinf(rps) else round(rps, 4),
            "lost": self.lost,
            "batches": self.batches,
            "bulk_on": dict(sorted(self.bulk_on.items())),
        }


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


@dataclass(slots=True)
class _Tally:
    cost: float = 0.0
    bulk_done: int = 0
    bulk_by_deadline: int = 0
    bulk_last: float = 0.0
    lost: int = 0
    latencies: list[float] = field(default_factory=list)
    served_on: Counter[str] = field(default_factory=Counter)
    batch_ok: int = 0
    batch_failed: int = 0


@dataclass(slots=True)
class _Run:
    """One strategy's run: the providers, the loop, the queue, what happened."""

    sc: LadderScenario
    strategy: str
    clock: VirtualClock
    seed: int
    big: FakeProvider = field(init=False)
    small: FakeProvider = field(init=False)
    loop: AsyncRateLoop = field(init=False)
    route: Route = field(init=False)
    backup: Route = field(init=False)
    tally: _Tally = field(default_factory=_Tally)
    queue: asyncio.Queue[int] = field(default_factory=asyncio.Queue)
    open_items: int = 0
    batch_waiting: list[int] = field(default_factory=list)
    batch_rounds: dict[int, int] = field(default_factory=dict)
    batch_task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    spawned: list[asyncio.Task[None]] = field(default_factory=list)
    transit_rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        sc, clock = self.sc, self.clock
        self.big = FakeProvider(clock=clock, limits=sc.standard, flex=sc.flex,
                                flex_latency=sc.flex_latency, batch=sc.batch, model=_BIG,
                                latency=sc.latency, refusal_latency=0.05, seed=self.seed,
                                # a batch item produces the bulk calls' output tokens
                                output_ratio=sc.bulk_tokens[2] / sc.bulk_tokens[1])
        self.small = FakeProvider(clock=clock, limits=sc.small, model=_SMALL,
                                  latency=sc.latency, refusal_latency=0.05, seed=self.seed)
        self.route = Route(provider="openai", model=_BIG, input_price_per_mtok=sc.big_prices[0],
                           output_price_per_mtok=sc.big_prices[1])
        self.backup = Route(provider="openai", model=_SMALL,
                            input_price_per_mtok=sc.small_prices[0],
                            output_price_per_mtok=sc.small_prices[1])
        ladder = LadderPolicy()
        if self.strategy == "ladder":
            ladder = LadderPolicy(interactive=("standard", "fallback"),
                                  background=("standard", "flex", "batch", "fallback", "park"))
        # Flex capacity is not published: its scope is configured without a number, and
        # the limiter learns it from the flex refusals.
        limits = {self.route.provider_scope: _spec(sc.standard, sc.reserve),
                  self.route.with_tier("flex").provider_scope: _spec(sc.flex, 0.0),
                  self.backup.provider_scope: _spec(sc.small, sc.reserve)}
        rng = random.Random(self.seed)
        limiter = Limiter(limits=limits, clock=clock, rng=random.Random(rng.random()))
        self.loop = AsyncRateLoop(Policy(ladder=ladder), limiter=limiter, clock=clock,
                                  rng=rng.random, sinks=[])
        self.transit_rng = random.Random(f"transit-{self.seed}")

    # -- one call ----------------------------------------------------------------------

    async def call(self, priority: str, tokens: tuple[int, int, int],
                   deadline: float | None) -> Outcome:
        input_tokens, max_tokens, output_tokens = tokens

        async def attempt(route: Route) -> FakeResponse:
            await asyncio.sleep(self.transit_rng.uniform(0.0, self.sc.transit))
            provider = self.small if route.model == _SMALL else self.big
            return await provider.arespond(FakeRequest(
                input_tokens=input_tokens, max_tokens=max_tokens, output_tokens=output_tokens,
                model=route.model, service_tier="flex" if route.tier == "flex" else None))

        fallbacks = [] if self.strategy == "standard" else [self.backup]
        outcome = await self.loop.call(
            attempt, route=self.route, fallbacks=fallbacks, priority=priority,
            cost=Cost(input_tokens=input_tokens, output_tokens=max_tokens),
            deadline=None if deadline is None else max(0.001, deadline - self.clock.monotonic()),
        )
        if outcome.ok:
            self.tally.cost += outcome.cost_usd or 0.0
        return outcome

    async def interactive(self, start: float) -> None:
        await asyncio.sleep(start)
        outcome = await self.call("interactive", self.sc.interactive_tokens,
                                  start + self.sc.interactive_deadline)
        if outcome.ok:
            self.tally.latencies.append(self.clock.monotonic() - start)
        else:
            self.tally.lost += 1  # the user got no answer

    # -- the bulk job ------------------------------------------------------------------

    async def worker(self) -> None:
        while True:
            item = await self.queue.get()
            if item < 0:
                return
            # Late work (past the deadline) still runs, without a deadline to miss.
            due = self.sc.deadline_secs if self.clock.monotonic() < self.sc.deadline_secs else None
            outcome = await self.call("background", self.sc.bulk_tokens, due)
            if outcome.ok:
                self.bulk_answered(outcome.rung or "standard")
            elif outcome.next_rung == "batch":
                self.to_batch(item)
            elif outcome.retry_at is not None:
                wait = (outcome.retry_at - self.clock.now()).total_seconds()
                self.spawn(self.requeue(item, wait))
            else:
                self.settle(lost=True)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` beside the workers; its errors surface at the end of the run."""
        task = asyncio.ensure_future(work)
        self.spawned.append(task)
        return task

    async def requeue(self, item: int, wait: float) -> None:
        await self.clock.asleep(wait)  # parked, as a task waits for its retry_at
        self.queue.put_nowait(item)

    def bulk_answered(self, rung: str) -> None:
        self.tally.served_on[rung] += 1
        now = self.clock.monotonic()
        self.tally.bulk_done += 1
        self.tally.bulk_by_deadline += now <= self.sc.deadline_secs
        self.tally.bulk_last = max(self.tally.bulk_last, now)
        self.settle(lost=False)

    def settle(self, *, lost: bool) -> None:
        self.tally.lost += lost
        self.open_items -= 1
        if self.open_items == 0:
            self.done.set()

    # -- the batch rung ----------------------------------------------------------------

    def to_batch(self, item: int) -> None:
        self.batch_waiting.append(item)
        if self.batch_task is None or self.batch_task.done():
            self.batch_task = self.spawn(self.submit_after_collecting())

    async def submit_after_collecting(self) -> None:
        await self.clock.asleep(self.sc.batch_collect_secs)
        items, self.batch_waiting = self.batch_waiting, []
        self.spawn(self.run_batch(items))

    async def run_batch(self, items: list[int]) -> None:
        inp, max_tokens, out = self.sc.bulk_tokens
        prompt = "x" * (4 * inp)  # the fake counts a token per 4 characters
        lines = [json.dumps({"custom_id": f"item-{i}", "method": "POST",
                             "url": "/v1/chat/completions",
                             "body": {"model": _BIG, "max_tokens": max_tokens,
                                      "messages": [{"role": "user", "content": prompt}]}})
                 for i in items]
        batches = self.big.batches
        upload = batches.upload("sim.jsonl", "\n".join(lines).encode(), "batch")
        _, batch = batches.create_openai({"input_file_id": upload["id"], "completion_window":
                                          "24h", "endpoint": "/v1/chat/completions"})
        settings = BatchSettings()
        delay, polls = settings.first_poll_secs, 0
        while True:
            await self.clock.asleep(delay)
            polls += 1
            batch = batches.retrieve("openai", batch["id"]) or batch
            if batch.get("status") in _ENDED:
                break
            delay = min(delay * 2, settings.max_poll_secs)
        ended: dict[int, tuple[int, Any]] = {}
        for key in ("output_file_id", "error_file_id"):
            stored = batches.file(batch[key]) if batch.get(key) else None
            for raw in (stored[1].splitlines() if stored else []):
                line = json.loads(raw)
                response = line.get("response") or {}
                ended[int(line["custom_id"][5:])] = (int(response.get("status_code") or 0),
                                                      response.get("body"))
        retry: list[int] = []
        discount = self.loop.policy.ladder.batch_discount
        for item in items:
            status, body = ended.get(item, (0, None))
            if status == 200:
                usage = body.get("usage", {}) if isinstance(body, dict) else {}
                price = self.route.price_usd(int(usage.get("prompt_tokens", inp)),
                                             int(usage.get("completion_tokens", out)),
                                             discount=discount)
                self.tally.cost += price or 0.0
                self.tally.batch_ok += 1
                self.bulk_answered("batch")
                continue
            self.tally.batch_failed += 1
            rounds = self.batch_rounds[item] = self.batch_rounds.get(item, 0) + 1
            if (status == 0 or status >= 500) and rounds < settings.max_rounds:
                retry.append(item)  # 5xx or expired: goes again in the next batch
            else:
                self.settle(lost=True)
        for item in retry:
            self.to_batch(item)

    # -- the whole run -----------------------------------------------------------------

    async def run(self) -> LadderResult:
        sc = self.sc
        self.open_items = sc.bulk_calls
        for item in range(sc.bulk_calls):
            self.queue.put_nowait(item)
        workers = [asyncio.ensure_future(self.worker()) for _ in range(sc.bulk_workers)]
        users = [asyncio.ensure_future(self.interactive(i * sc.interactive_every))
                 for i in range(sc.interactive_calls)]
        await asyncio.gather(*users)
        await self.done.wait()
        for _ in workers:
            self.queue.put_nowait(-1)
        await asyncio.gather(*workers, *self.spawned)
        t = self.tally
        stats = (self.big.stats, self.small.stats)
        return LadderResult(
            strategy=self.strategy,
            cost_usd=t.cost,
            bulk_done=t.bulk_done,
            bulk_calls=sc.bulk_calls,
            bulk_done_by_deadline=t.bulk_by_deadline,
            bulk_finished=t.bulk_last if t.bulk_done == sc.bulk_calls else None,
            interactive_latencies=t.latencies,
            interactive_calls=sc.interactive_calls,
            refusals=sum(s.refused for s in stats) + t.batch_failed,
            successes=sum(s.served for s in stats) + t.batch_ok,
            lost=t.lost,
            bulk_on=t.served_on,
            batches=self.big.stats.batches,
        )


def _spec(limits: FakeLimits, reserve: float) -> LimitSpec:
    return LimitSpec(requests_per_minute=limits.rpm, tokens_per_minute=limits.tpm,
                     burst=limits.burst_seconds / 60, reserve=reserve)


def run_ladder(
    strategy: str, scenario: LadderScenario | None = None, *, seed: int = 1
) -> LadderResult:
    """Simulate the ladder scenario under ``strategy`` (see :data:`LADDER_STRATEGIES`)."""
    if strategy not in LADDER_STRATEGIES:
        raise ValueError(f"unknown ladder strategy {strategy!r}; allowed: "
                         f"{', '.join(LADDER_STRATEGIES)}")
    sc = scenario if scenario is not None else LadderScenario()

    async def main() -> LadderResult:
        return await _Run(sc, strategy, VirtualClock(), seed).run()

    return run_virtual(main())


def render_ladder(scenario: LadderScenario, results: list[LadderResult],
                  console: Console) -> None:
    """The ladder table: cost, the bulk job's end, interactive p95, refusals, work lost."""
    console.print("[bold]" + scenario.lines()[0] + "[/bold]\n" + "\n".join(scenario.lines()[1:]),
                  highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("strategy", no_wrap=True)
    by = f"bulk by {_hours(scenario.deadline_secs).replace(' ', '')}"
    for name in ("cost", by, "bulk ends", "int. p95", "refused/ok", "lost"):
        table.add_column(name, justify="right", no_wrap=True)
    served = ["bulk calls answered on"]
    width = max((len(LADDER_STRATEGIES[r.strategy]) for r in results), default=0)
    for r in results:
        rps = r.refusals_per_success
        table.add_row(
            LADDER_STRATEGIES[r.strategy],
            f"${r.cost_usd:.2f}",
            f"{r.bulk_done_by_deadline:,}/{r.bulk_calls:,}",
            duration(r.bulk_finished),
            duration(r.interactive_p95()),
            "∞" if math.isinf(rps) else f"{rps:.2f}",
            str(r.lost),
            style="bold" if r.strategy == "ladder" else None,
        )
        on = ", ".join(f"{rung} {n:,}" for rung, n in
                       sorted(r.bulk_on.items(), key=lambda kv: (-kv[1], kv[0])))
        served.append(f"  {LADDER_STRATEGIES[r.strategy]:<{width}}  {on or 'none'}")
    console.print(table)
    console.print("\n".join(served), highlight=False)
