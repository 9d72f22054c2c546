"""FakeProvider: a provider that enforces limits like the real ones, for tests and simulation.

How it works.  An attempt is two steps around the time the provider takes:
``_open`` counts the attempt, applies scripted and random faults, then the
spend flag, the day quota, concurrency and the per-minute buckets (see
:mod:`.buckets`); it either returns a refusal at once or admits the request
(taking its tokens and a concurrency slot).  ``_close`` runs when the answer
is ready: it frees the slot, corrects an estimated output charge
(Anthropic), counts the tokens served and builds the 200 response with the
buckets' headers.  :meth:`FakeProvider.respond` waits between the two on the
clock with ``sleep``, :meth:`FakeProvider.arespond` with ``asleep`` -- so on a
virtual clock a slow response holds its slot for virtual seconds.

The checks run in a fixed order and the first that refuses answers: faults,
spend, day quota, concurrency, then every bucket at once (the one with the
longest wait is named).  A refused request still spends a request slot when
``rejected_spends_request`` (the default: providers count refused requests).
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rateloop._clock import Clock, system_clock
from rateloop.route import Route
from rateloop.testing._fake import batch_http, shapes
from rateloop.testing._fake.asgi import handle_httpx, serve_asgi
from rateloop.testing._fake.batch import Batches, FakeBatch
from rateloop.testing._fake.buckets import (
    PROFILES,
    Bucket,
    FakeLimits,
    Profile,
    TokenCharge,
    charge_of,
)
from rateloop.testing._fake.model import FAULTS, FakeRequest, FakeResponse, FakeStats, Slow
from rateloop.testing.faults import FaultScript

__all__ = ["FakeProvider"]


@dataclass(slots=True)
class _Ticket:
    """An admitted request, between ``_open`` and ``_close``."""

    request: FakeRequest
    profile: Profile
    request_id: str
    charge: TokenCharge
    output_tokens: int
    delay: float
    stream_error: bool
    flex: bool = False


class FakeProvider:
    """A fake model provider enforcing RPM, TPM, ITPM, OTPM, RPD and concurrency.

    >>> from rateloop.testing import FakeClock, FakeProvider, FakeRequest
    >>> fake = FakeProvider(profile="openai", rpm=60, burst_seconds=2, clock=FakeClock())
    >>> [fake.respond(FakeRequest()).status_code for _ in range(3)]
    [200, 200, 429]
    >>> fake.stats.attempts, fake.stats.refusals["requests"]
    (3, 1)

    ``faults`` is a script of faults for successive attempts: a list (each
    item a fault name from :data:`FAULTS`, a :class:`Slow`, or ``None`` for a
    normal answer; after the list, answers are normal) or a
    :class:`~rateloop.testing.FaultScript` (its last item repeats).
    ``fault_rates`` maps fault names to probabilities drawn from a ``seed``ed
    generator.
    """

    def __init__(
        self,
        *,
        profile: Profile = "openai",
        rpm: int | None = None,
        tpm: int | None = None,
        itpm: int | None = None,
        otpm: int | None = None,
        rpd: int | None = None,
        concurrency: int | None = None,
        burst_seconds: float = 5.0,
        limits: FakeLimits | None = None,
        flex: FakeLimits | None = None,
        flex_latency: float = 0.0,
        batch: FakeBatch | None = None,
        model: str = "fake-model",
        latency: float = 0.0,
        refusal_latency: float = 0.0,
        output_ratio: float = 1.0,
        rejected_spends_request: bool = True,
        faults: Sequence[str | Slow | None] | FaultScript | None = None,
        fault_rates: Mapping[str, float] | None = None,
        seed: int = 0,
        clock: Clock | None = None,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        if limits is None:
            limits = FakeLimits(rpm=rpm, tpm=tpm, itpm=itpm, otpm=otpm, rpd=rpd,
                                concurrency=concurrency, burst_seconds=burst_seconds)
        if flex is not None and (flex.rpd is not None or flex.concurrency is not None):
            raise ValueError("flex capacity takes rpm, tpm, itpm, otpm and burst_seconds "
                             f"(the day quota and concurrency are the account's), got {flex!r}")
        for name, value in (("latency", latency), ("refusal_latency", refusal_latency),
                            ("flex_latency", flex_latency)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        if isinstance(output_ratio, bool) or not 0 <= output_ratio <= 1:
            raise ValueError(f"output_ratio must be a fraction 0..1, got {output_ratio!r}")
        self.profile: Profile = profile
        self.limits = limits
        self.model = model
        self.latency = float(latency)
        self.flex = flex
        self.flex_latency = float(flex_latency)
        self.refusal_latency = float(refusal_latency)
        self.output_ratio = float(output_ratio)
        self.rejected_spends_request = rejected_spends_request
        self.clock = clock if clock is not None else system_clock
        self._script = self._as_script(faults)
        self._lock = threading.Lock()
        self._rates: dict[str, float] = {}
        self.set_fault_rates(fault_rates)
        self._rng = random.Random(seed)
        self.stats = FakeStats()
        self._spent = False
        self._day_index = -1
        self._day_count = 0
        self._day_exhausted = False
        self._next_id = 0
        self._buckets = self._new_buckets(self.limits)
        self._flex_buckets = self._new_buckets(self.flex)
        self.batches = Batches(self, batch or FakeBatch(), seed=seed)

    @staticmethod
    def _as_script(faults: Sequence[str | Slow | None] | FaultScript | None) -> FaultScript | None:
        if faults is None or isinstance(faults, FaultScript):
            return faults
        items = list(faults)
        for item in items:
            if item is not None and not isinstance(item, Slow) and item not in FAULTS:
                raise ValueError(f"unknown fault {item!r}; allowed: {', '.join(FAULTS)}, "
                                 "Slow(seconds) or None")
        # After the scripted faults, answer normally (FaultScript repeats its last item).
        return FaultScript([*items, None])

    def _new_buckets(self, lim: FakeLimits | None) -> dict[str, Bucket]:
        if lim is None:
            return {}
        now = self.clock.monotonic()
        pairs = (("requests", lim.rpm), ("tokens", lim.tpm), ("input_tokens", lim.itpm),
                 ("output_tokens", lim.otpm))
        return {name: Bucket(limit, lim.burst_seconds, now) for name, limit in pairs if limit}

    def __repr__(self) -> str:
        lim = self.limits
        set_ = {k: getattr(lim, k) for k in ("rpm", "tpm", "itpm", "otpm", "rpd", "concurrency")}
        shown = ", ".join(f"{k}={v}" for k, v in set_.items() if v is not None)
        attempts = self.stats.attempts
        return f"FakeProvider({self.profile!r}, {shown or 'unlimited'}, attempts={attempts})"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """The provider is an ASGI app: ``httpx.ASGITransport(app=fake)``."""
        await serve_asgi(self, scope, receive, send)

    def batch_route(self, method: str, path: str, headers: Mapping[str, str],
                    body: bytes) -> tuple[int, str, bytes] | None:
        """The answer of a batch endpoint (``None``: ``path`` is not one); see ``batch_http``."""
        return batch_http.route(self.batches, method, path, headers, body)

    def handler(self, request: Any) -> Any:
        """A sync handler for ``httpx.MockTransport`` / ``httpx2.MockTransport``.

        ``httpx.Client(transport=httpx.MockTransport(fake.handler))`` talks to
        the fake in-process, without a socket or an event loop.
        """
        return handle_httpx(self, request)

    # -- state the tests drive -------------------------------------------------------

    def exhaust_day(self) -> None:
        """Spend the day's quota now: refuse with a day-quota 429 until the next UTC day."""
        with self._lock:
            self._roll_day()
            self._day_exhausted = True

    def exhaust_spend(self, exhausted: bool = True) -> None:
        """Refuse every request as out of credit (``False`` to refill the account)."""
        with self._lock:
            self._spent = exhausted

    def set_fault_rates(self, fault_rates: Mapping[str, float] | None) -> None:
        """Change the random faults from now on (an overload storm starts or ends)."""
        rates = dict(fault_rates or {})
        for name, p in rates.items():
            if name not in FAULTS:
                raise ValueError(f"unknown fault {name!r} in fault_rates; allowed: "
                                 f"{', '.join(FAULTS)}")
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p <= 1:
                raise ValueError(f"fault_rates[{name!r}] must be a probability 0..1, got {p!r}")
        with self._lock:
            self._rates = rates

    def reset(self) -> None:
        """Full buckets, a new day, empty counters (the configuration is kept)."""
        with self._lock:
            self.stats = FakeStats()
            self._buckets = self._new_buckets(self.limits)
            self._flex_buckets = self._new_buckets(self.flex)
            self._day_index, self._day_count, self._day_exhausted = -1, 0, False
            self._spent = False
        self.batches.clear()

    # -- one attempt -----------------------------------------------------------------

    def respond(self, request: FakeRequest | None = None) -> FakeResponse:
        """Answer one request, waiting the provider's time on the clock (blocking)."""
        response, ticket = self._open(request or FakeRequest())
        if ticket is None:
            if response.delay:
                self.clock.sleep(response.delay)
            return response
        if ticket.delay:
            self.clock.sleep(ticket.delay)
        return self._close(ticket)

    async def arespond(self, request: FakeRequest | None = None) -> FakeResponse:
        """Answer one request, awaiting the provider's time on the clock."""
        response, ticket = self._open(request or FakeRequest())
        if ticket is None:
            if response.delay:
                await self.clock.asleep(response.delay)
            return response
        if ticket.delay:
            await self.clock.asleep(ticket.delay)
        return self._close(ticket)

    def _roll_day(self) -> float:
        """Move to the provider's current day; the seconds left in it.

        OpenAI and Anthropic days are UTC days; Gemini's reset at midnight
        Pacific time (as ``rateloop.classify`` expects).
        """
        now = self.clock.now()
        if self.profile == "gemini":
            # Without a tz database the day stays the UTC day.
            with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
                now = now.astimezone(ZoneInfo("America/Los_Angeles"))
        index = now.date().toordinal()
        if index != self._day_index:
            self._day_index, self._day_count, self._day_exhausted = index, 0, False
        midnight = datetime.combine(now.date() + timedelta(days=1), time(), tzinfo=now.tzinfo)
        return (midnight - now).total_seconds()

    def _next_fault(self) -> str | Slow | None:
        if self._script is not None:
            item = self._script(Route(provider=self.profile, model=self.model))
            if item is not None:
                return item  # type: ignore[no-any-return]
        for name, p in self._rates.items():
            if p and self._rng.random() < p:
                return name
        return None

    def _open(self, request: FakeRequest) -> tuple[FakeResponse, _Ticket | None]:
        with self._lock:
            response, ticket = self._admit(request)
            if request.service_tier == "flex":
                self.stats.flex_attempts += 1
                self.stats.flex_refused += ticket is None
            return response, ticket

    def _admit(self, request: FakeRequest) -> tuple[FakeResponse, _Ticket | None]:
        stats = self.stats
        stats.attempts += 1
        self._next_id += 1
        request_id = f"req_fake{self._next_id:08d}"
        profile = request.profile or self.profile
        model = request.model if request.model != "fake-model" else self.model
        flex = request.service_tier == "flex"
        if flex and profile != "openai":
            raise ValueError(f"service_tier='flex' is OpenAI's; this request's profile is "
                             f"{profile!r}")
        fault = self._next_fault()
        delay = self.latency + (self.flex_latency if flex else 0.0)
        if isinstance(fault, Slow):
            delay += fault.seconds
            fault = None
        stream_error = fault == "stream_error" and request.stream
        if fault == "reset":
            stats.refusals["reset"] += 1
            return FakeResponse(status_code=0, headers={}, reset=True, refused="reset",
                                delay=self.refusal_latency), None
        if fault is not None and not stream_error:
            return self._refuse(profile, fault, model, request_id, self._fault_wait(fault),
                                {"rate_limit": self.limits.rpm,
                                 "period_quota": self.limits.rpd}.get(fault), 1), None
        if flex and self.flex is None:
            return self._refuse(profile, "flex_unsupported", model, request_id, None, None,
                                None), None
        if self._spent:
            return self._refuse(profile, "spend", model, request_id, None, None, None), None
        left_today = self._roll_day()
        rpd = self.limits.rpd
        if self._day_exhausted or (rpd is not None and self._day_count >= rpd):
            return self._refuse(profile, "requests_per_day", model, request_id, left_today,
                                rpd, 1), None
        cap = self.limits.concurrency
        if cap is not None and stats.in_flight >= cap:
            return self._refuse(profile, "concurrency", model, request_id, None, cap,
                                1), None
        charge = charge_of(profile, request.input_tokens, request.max_tokens,
                           request.cache_read_tokens)
        buckets = self._flex_buckets if flex else self._buckets
        refused = self._check_buckets(charge, buckets)
        if refused is not None and flex:
            # Flex capacity is out: a 429 "Resource Unavailable", not charged (so no slot
            # is spent) and naming no wait (see shapes).
            return self._refuse(profile, "resource_unavailable", model, request_id, None,
                                None, None), None
        if refused is not None:
            if self.rejected_spends_request and "requests" in buckets:
                buckets["requests"].spend_refused(1)
                # The wait told must cover the slot this refusal just spent.
                refused = self._check_buckets(charge, buckets) or refused
            name, wait = refused
            bucket = buckets[name]
            return self._refuse(profile, name, model, request_id, wait, bucket.limit,
                                self._amount(name, charge)), None
        for name, bucket in buckets.items():
            bucket.take(self._amount(name, charge))
        self._day_count += 1
        stats.in_flight += 1
        stats.peak_concurrency = max(stats.peak_concurrency, stats.in_flight)
        output = request.output_tokens
        if output is None:
            output = math.ceil(request.max_tokens * self.output_ratio)
        output = min(output, request.max_tokens)
        ticket = _Ticket(request=request, profile=profile, request_id=request_id,
                         charge=charge, output_tokens=output, delay=delay,
                         stream_error=stream_error, flex=flex)
        return FakeResponse(status_code=102, headers={}), ticket

    def _fault_wait(self, fault: str) -> float | None:
        """The wait a scripted refusal tells, as the provider's own would.

        A ``rate_limit`` 429 says when the requests bucket has a slot (at least
        1 s, as the APIs round it); a ``period_quota`` 429 says when the
        provider's day ends.  Overloads and server errors tell no wait.
        """
        if fault == "rate_limit":
            bucket = self._buckets.get("requests")
            wait = bucket.wait_for(1, self.clock.monotonic()) if bucket is not None else None
            return max(1.0, wait or 0.0)
        if fault == "period_quota":
            return self._roll_day()
        return None

    @staticmethod
    def _amount(name: str, charge: TokenCharge) -> int:
        return {"requests": 1, "tokens": charge.total, "input_tokens": charge.input,
                "output_tokens": charge.output}[name]

    def _check_buckets(
        self, charge: TokenCharge, buckets: Mapping[str, Bucket] | None = None
    ) -> tuple[str, float] | None:
        now = self.clock.monotonic()
        worst: tuple[str, float] | None = None
        for name, bucket in (self._buckets if buckets is None else buckets).items():
            wait = bucket.wait_for(self._amount(name, charge), now)
            if wait is None:  # larger than the whole minute's limit: it never fits
                return name, 60.0
            if wait > 0 and (worst is None or wait > worst[1]):
                worst = (name, wait)
        return worst

    def _refuse(
        self,
        profile: Profile,
        reason: str,
        model: str,
        request_id: str,
        wait: float | None,
        limit: int | None,
        requested: int | None,
    ) -> FakeResponse:
        self.stats.refusals[reason] += 1
        response = shapes.refusal(
            profile, reason, model=model, request_id=request_id, wait=wait, limit=limit,
            requested=requested, headers=shapes.rate_headers(profile, self._buckets,
                                                             self.clock.now()),
        )
        response.delay = self.refusal_latency
        return response

    def _close(self, ticket: _Ticket) -> FakeResponse:
        with self._lock:
            stats = self.stats
            stats.in_flight = max(0, stats.in_flight - 1)
            request, charge = ticket.request, ticket.charge
            if ticket.profile == "anthropic":
                # OTPM was charged max_tokens; the response tells the real count.
                unused = max(0, charge.output - ticket.output_tokens)
                for name in ("output_tokens", "tokens"):
                    if name in self._buckets:
                        self._buckets[name].give_back(unused)
            # The headers tell the buckets as they are now, refilled since the last request.
            mono = self.clock.monotonic()
            for bucket in (*self._buckets.values(), *self._flex_buckets.values()):
                bucket.refill(mono)
            now = self.clock.now()
            response = shapes.success(
                ticket.profile,
                model=request.model if request.model != "fake-model" else self.model,
                request_id=ticket.request_id,
                created=int(now.timestamp()),
                input_tokens=request.input_tokens,
                output_tokens=ticket.output_tokens,
                cache_read_tokens=request.cache_read_tokens,
                stream=request.stream,
                headers=shapes.rate_headers(ticket.profile, self._buckets, now),
                service_tier="flex" if ticket.flex else "default",
            )
            if ticket.stream_error:
                stats.refusals["stream_error"] += 1
                response.chunks = [*response.chunks[:1],
                                   shapes.stream_error_chunk(ticket.profile, ticket.request_id)]
                response.content = b"".join(response.chunks)
                response.refused = "stream_error"
                return response
            stats.served += 1
            stats.flex_served += ticket.flex
            stats.input_tokens += request.input_tokens
            stats.output_tokens += ticket.output_tokens
            stats.cache_read_tokens += request.cache_read_tokens
            return response
