"""The fleet simulator: virtual time, workloads, baselines, harness measures, the CLI."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rateloop.cli import app
from rateloop.route import Route
from rateloop.sim import (
    Workload,
    build_scenario,
    ideal_seconds,
    load_trace,
    run_strategy,
    run_virtual,
)
from rateloop.sim.harness import achievable_tasks
from rateloop.sim.strategies import SimContext, make_caller
from rateloop.sim.vtime import MIN_SLEEP, SimulationStuck, VirtualClock
from rateloop.sim.workload import CallSpec
from rateloop.testing import FakeLimits, FakeProvider

SMALL = {"tasks": 12, "calls": 3, "rpm": 30, "tpm": 20_000}


# --- virtual time -----------------------------------------------------------------------


def test_virtual_time_runs_an_hour_at_once_and_in_order() -> None:
    clock = VirtualClock()
    order: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.asleep(seconds)
        order.append((name, clock.monotonic()))

    async def main() -> float:
        await asyncio.gather(sleeper("late", 3600), sleeper("early", 10), sleeper("mid", 600))
        return clock.monotonic()

    assert run_virtual(main()) == 3600.0
    assert order == [("early", 10.0), ("mid", 600.0), ("late", 3600.0)]


def test_a_zero_wait_still_moves_virtual_time() -> None:
    clock = VirtualClock()

    async def main() -> float:
        await clock.asleep(0)
        return clock.monotonic()

    assert run_virtual(main()) == MIN_SLEEP


def test_a_deadlock_raises_instead_of_hanging() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimulationStuck, match="nothing is scheduled"):
        run_virtual(main())


def test_a_threads_job_takes_no_virtual_time() -> None:
    async def main() -> tuple[int, float, float]:
        loop = asyncio.get_running_loop()
        timer = asyncio.ensure_future(asyncio.sleep(5))
        value = await asyncio.to_thread(sum, [40, 2])  # done before the 5 s timer fires
        during = loop.time()
        await timer
        return value, during, loop.time()

    assert run_virtual(main()) == (42, 0.0, 5.0)


def test_virtual_clock_outside_run_virtual_says_where_to_build() -> None:
    with pytest.raises(RuntimeError, match=r"outside run_virtual\(\).*inside the coroutine"):
        FakeProvider(rpm=60, clock=VirtualClock())


def test_the_sdk_over_the_asgi_app_on_virtual_time() -> None:
    """The real openai SDK, in-process through httpx's ASGI transport, on virtual time."""
    import httpx
    import openai

    async def main() -> tuple[list[str], int, float]:
        clock = VirtualClock()
        fake = FakeProvider(rpm=60, burst_seconds=1, latency=30.0, clock=clock)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
        client = openai.AsyncOpenAI(base_url="http://fake/v1", api_key="k", http_client=http)

        async def ask() -> str:
            reply = await client.chat.completions.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
            return reply.choices[0].finish_reason

        answers = await asyncio.gather(ask(), ask(), ask())
        await client.close()
        return list(answers), fake.stats.refused, clock.monotonic()

    answers, refused, elapsed = run_virtual(main())
    # One slot a second: two of the three are refused first, wait the retry-after the SDK
    # reads, and are answered; the provider's 30 s answers pass on the virtual clock.
    assert answers == ["stop"] * 3
    assert refused >= 2
    assert 30.0 < elapsed < 40.0


def test_virtual_clock_refuses_to_block() -> None:
    with pytest.raises(RuntimeError, match="cannot block"):
        VirtualClock().sleep(1)


# --- workloads ------------------------------------------------------------------------------


def test_generated_workload_is_seeded_and_shaped() -> None:
    a = Workload.generate(tasks=5, calls=3, seed=3, arrival_secs=100, processes=2)
    assert a == Workload.generate(tasks=5, calls=3, seed=3, arrival_secs=100, processes=2)
    assert a.calls == 15
    assert [t.start for t in a.tasks] == [0.0, 20.0, 40.0, 60.0, 80.0]
    assert [t.group for t in a.tasks] == [0, 1, 0, 1, 0]
    flat = Workload.generate(tasks=2, calls=2, spread=0, input_tokens=600, max_tokens=400,
                             output_ratio=0.5)
    assert {c for t in flat.tasks for c in t.calls} == {CallSpec(600, 400, 200)}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tasks": 0, "calls": 1}, "tasks must be an integer >= 1, got 0"),
        ({"tasks": 1, "calls": 1, "output_ratio": 2.0}, "output_ratio must be a fraction"),
        ({"tasks": 1, "calls": 1, "arrival_secs": -1}, "arrival_secs must be >= 0"),
    ],
)
def test_bad_workload_options_are_named(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Workload.generate(**options)  # type: ignore[arg-type]


def test_traces_in_csv_and_jsonl(tmp_path: Path) -> None:
    csv_file = tmp_path / "calls.csv"
    csv_file.write_text("task,start,input_tokens,max_tokens,output_tokens\n"
                        "a,0,100,50,20\na,0,200,50,\nb,30,300,80,90\n")
    trace = load_trace(csv_file)
    assert [(t.start, t.calls) for t in trace.tasks] == [
        (0.0, (CallSpec(100, 50, 20), CallSpec(200, 50, 50))),
        (30.0, (CallSpec(300, 80, 80),)),  # output capped at max_tokens
    ]
    jsonl = tmp_path / "calls.jsonl"
    jsonl.write_text('{"input_tokens": 10, "max_tokens": 5}\n\n{"input_tokens": 20, '
                     '"max_tokens": 6}\n')
    assert load_trace(jsonl).calls == 2  # each row without a task is its own task
    # Blank task cells are tasks of their own too (never one task of every blank row), and a
    # row numbered like a named task does not join it.
    blanks = tmp_path / "blanks.csv"
    blanks.write_text("task,input_tokens,max_tokens,start\n,10,5,\n,20,5,2.5\n2,30,5,1\n"
                      "2,40,5,\n")
    assert [(t.start, len(t.calls)) for t in load_trace(blanks).tasks] == [
        (0.0, 1), (2.5, 1), (1.0, 2)]
    negative = tmp_path / "negative.csv"
    negative.write_text("task,input_tokens,max_tokens,start\na,10,5,0\na,10,5,-1\n")
    with pytest.raises(ValueError, match=r"row 2: start must be seconds >= 0, got '-1'"):
        load_trace(negative)
    boolean = tmp_path / "bool.jsonl"
    boolean.write_text('{"input_tokens": 10, "max_tokens": 5, "start": true}\n')
    with pytest.raises(ValueError, match=r"row 1: start must be seconds >= 0, got True"):
        load_trace(boolean)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_tokens": 10}\n')
    with pytest.raises(ValueError, match="missing 'max_tokens'"):
        load_trace(bad)
    with pytest.raises(ValueError, match=r"must be \.csv or \.jsonl"):
        load_trace(tmp_path / "calls.txt")


# --- the ideal, by hand ------------------------------------------------------------------------

FLAT = Workload.generate(tasks=40, calls=5, spread=0, input_tokens=600, max_tokens=400)


def test_ideal_is_the_tightest_bucket_beyond_its_burst() -> None:
    tasks = [(t.start, t.calls) for t in FLAT.tasks]
    limits = FakeLimits(rpm=60, tpm=40_000, burst_seconds=5)
    # OpenAI counts 600 + 400 = 1000 tokens a call: (200,000 - 3,333.3) / 666.7 = 295 s
    # until the last call is admitted, and its answer takes 2 s more: 297 s;
    # requests: (200 - 5) / 1 + 2 = 197 s; each task's own chain: 5 × 2 s = 10 s.
    assert ideal_seconds(profile="openai", limits=limits, latency=2.0,
                         tasks=tasks) == pytest.approx(297.0)
    assert ideal_seconds(profile="openai", limits=FakeLimits(rpm=60), latency=2.0,
                         tasks=tasks) == pytest.approx(197.0)
    assert ideal_seconds(profile="openai", limits=FakeLimits(concurrency=4), latency=2.0,
                         tasks=tasks) == pytest.approx(100.0)  # 200 × 2 s / 4
    assert ideal_seconds(profile="openai", limits=FakeLimits(), latency=2.0,
                         tasks=tasks) == pytest.approx(10.0)


def test_achievable_tasks_fit_the_day_quota() -> None:
    assert len(achievable_tasks(FLAT.tasks, 120)) == 24  # 24 tasks × 5 calls
    assert len(achievable_tasks(FLAT.tasks, None)) == 40


# --- the baselines, as their documentation reads ------------------------------------------------


def _context(provider: FakeProvider, clock: VirtualClock) -> SimContext:
    return SimContext(provider=provider, clock=clock, rng=random.Random(0), configured=None,
                      route=Route(provider="openai", model="m"))


def _one_call(strategy: str, **provider_options: object) -> tuple[bool, int, float, str]:
    clock = VirtualClock()

    async def main() -> tuple[bool, int, float, str]:
        provider = FakeProvider(clock=clock, **provider_options)  # type: ignore[arg-type]
        caller = make_caller(strategy, _context(provider, clock), 0)
        result = await caller(CallSpec(10, 10, 10))
        return result.ok, result.attempts, clock.monotonic(), result.status

    return run_virtual(main())


def test_sdk_model_two_retries_with_backoff() -> None:
    ok, attempts, elapsed, status = _one_call("sdk", faults=["overload"] * 5)
    assert (ok, attempts, status) == (False, 3, "raised after 3 attempts")
    # 0.5 s then 1 s, each reduced by at most 25 %.
    assert 0.75 * 1.5 <= elapsed <= 1.5


def test_sdk_model_honours_retry_after_and_refuses_beyond_120_s() -> None:
    ok, attempts, _elapsed, _ = _one_call("sdk", rpm=60, burst_seconds=1, faults=[None])
    assert (ok, attempts) == (True, 1)
    clock = VirtualClock()

    async def main() -> tuple[int, float]:
        provider = FakeProvider(clock=clock, rpm=60, burst_seconds=1)
        caller = make_caller("sdk", _context(provider, clock), 0)
        await caller(CallSpec(10, 10, 10))
        result = await caller(CallSpec(10, 10, 10))  # 429 retry-after 2 s, then served
        return result.attempts, clock.monotonic()

    assert run_virtual(main()) == (2, 2.0)
    clock2 = VirtualClock()

    async def day() -> tuple[int, str]:
        provider = FakeProvider(clock=clock2, rpd=1)
        caller = make_caller("sdk", _context(provider, clock2), 0)
        await caller(CallSpec(10, 10, 10))
        result = await caller(CallSpec(10, 10, 10))  # retry-after: hours until midnight
        return result.attempts, result.status

    assert run_virtual(day()) == (1, "retry-after beyond 120 s: not retried")
    # A scripted day-quota 429 tells the hours to the provider's midnight, as a real one does.
    ok, attempts, _, status = _one_call("sdk", faults=["period_quota"] * 5)
    assert (ok, attempts, status) == (False, 1, "retry-after beyond 120 s: not retried")


def test_tenacity_model_six_attempts_random_exponential() -> None:
    ok, attempts, elapsed, status = _one_call("tenacity", faults=["overload"] * 10)
    assert (ok, attempts, status) == (False, 6, "RetryError after 6 attempts")
    # waits uniform in [1, min(60, 2^(n-1))] for n = 1..5: at least 5 s, at most 1+2+4+8+16.
    assert 5.0 <= elapsed <= 31.0


def test_litellm_model_sdk_retries_then_its_own_two() -> None:
    # The SDK's three attempts (0.5 s, 1 s backoff), then LiteLLM's wrapper: two more,
    # no wait after an overload (constant_retry).
    ok, attempts, elapsed, status = _one_call("litellm", faults=["overload"] * 10)
    assert (ok, attempts, status) == (False, 5, "raised after 5 attempts")
    assert 0.75 * 1.5 <= elapsed <= 1.5
    # After a 429 (RateLimitError, retry-after: 1) the SDK waits the 1 s it is told, twice,
    # and the wrapper waits 1 s between its two attempts.
    ok, attempts, elapsed, _ = _one_call("litellm", faults=["rate_limit"] * 10)
    assert (ok, attempts) == (False, 5)
    assert elapsed == pytest.approx(3.0)
    # The wrapper's retries serve a call the SDK gave up on.
    ok, attempts, _, _ = _one_call("litellm", faults=["overload"] * 3)
    assert (ok, attempts) == (True, 4)


def test_immediate_model_never_waits() -> None:
    ok, attempts, elapsed, _ = _one_call("immediate", faults=["overload"] * 20)
    assert (ok, attempts, elapsed) == (False, 10, 0.0)


# --- the harness ----------------------------------------------------------------------------------


def test_requests_reach_the_provider_after_a_random_transit() -> None:
    clock = VirtualClock()

    async def main(transit: float) -> list[float]:
        provider = FakeProvider(clock=clock)
        ctx = SimContext(provider=provider, clock=clock, rng=random.Random(0), configured=None,
                         route=Route(provider="openai", model="m"), transit=transit,
                         transit_rng=random.Random(1))
        seen = []
        for _ in range(20):
            start = clock.monotonic()
            await ctx.attempt(CallSpec(10, 10, 10))
            seen.append(clock.monotonic() - start)
        return seen

    delays = run_virtual(main(0.01))
    assert all(0 < d <= 0.01 for d in delays)
    assert len(set(delays)) == 20  # each request its own delay, not one fixed shift
    assert run_virtual(main(0.0)) == [0.0] * 20


def test_scenarios_carry_the_transit_into_the_run() -> None:
    assert build_scenario("burst").transit == 0.01  # the default: 0-10 ms
    flat = Workload.generate(tasks=1, calls=1, seed=1)
    slow = build_scenario("burst", latency=0.0, transit=0.5, rpm=None, tpm=None, workload=flat)
    assert "0-500 ms" in slow.limits_text()
    end = run_strategy(slow, "immediate").tasks[0].end
    assert 0 < end <= 0.5
    none = build_scenario("burst", latency=0.0, transit=0.0, rpm=None, tpm=None, workload=flat)
    assert run_strategy(none, "immediate").tasks[0].end == 0.0



def test_rateloop_completes_the_burst_near_the_ideal() -> None:
    scenario = build_scenario("burst", **SMALL)  # type: ignore[arg-type]
    result = run_strategy(scenario, "rateloop")
    assert (result.completed, result.lost, result.deferred) == (12, 0, 0)
    assert result.efficiency > 0.7  # one 429 at the start slows the AIMD factor for a while
    assert result.rejected_per_success < 0.1
    again = run_strategy(scenario, "rateloop")
    assert again.wall == result.wall  # virtual time: deterministic


def test_baselines_lose_work_that_rateloop_completes() -> None:
    scenario = build_scenario("burst", **SMALL)  # type: ignore[arg-type]
    sdk = run_strategy(scenario, "sdk")
    assert sdk.lost > 0
    assert sdk.rejected_per_success > 1
    assert sdk.provider_attempts == sum(t.attempts for t in sdk.tasks)


def test_day_quota_rateloop_defers_instead_of_hammering() -> None:
    scenario = build_scenario("daily", **SMALL)  # type: ignore[arg-type]
    assert scenario.limits.rpd == 21  # 3/5 of 36 calls
    loop = run_strategy(scenario, "rateloop")
    tenacity = run_strategy(scenario, "tenacity")
    assert loop.lost == 0 and loop.deferred > 0
    assert loop.served <= 21
    assert tenacity.provider_refusals > 5 * max(1, loop.provider_refusals)


def test_shared_budget_rateloop_shares_its_limiter_state() -> None:
    scenario = build_scenario("shared", **SMALL)  # type: ignore[arg-type]
    assert scenario.processes == 4
    shared = run_strategy(scenario, "rateloop")
    alone = run_strategy(scenario, "rateloop-zero")
    assert shared.completed == 12
    assert shared.provider_refusals < alone.provider_refusals


def test_processes_that_share_no_limiter_do_not_livelock() -> None:
    # Four zero-config processes on one budget, each learning alone: each waited out the
    # blocks it was told and returned with the others; every refused request spent a slot,
    # so from 30 s to 120 s nobody was served (39 %, 2.97 refused per success, 4 tasks
    # deferred).  Refused again after waiting, a process now waits longer.
    alone = run_strategy(build_scenario("shared"), "rateloop-zero")
    assert alone.completed == 40
    assert alone.efficiency > 0.6
    assert alone.rejected_per_success < 1.5


def test_storm_and_lower_limits_are_survived() -> None:
    storm = build_scenario("storm", **SMALL)  # type: ignore[arg-type]
    result = run_strategy(storm, "rateloop")
    assert result.completed == 12
    assert result.provider_refusals > 0  # the storm did hit
    lower = build_scenario("lower", **SMALL)  # type: ignore[arg-type]
    assert lower.limits.rpm == 15 and lower.configured.requests_per_minute == 30
    assert run_strategy(lower, "rateloop").completed == 12


def test_limits_the_provider_states_lower_than_configured_bind() -> None:
    # The default `lower` table: configured 60 RPM / 40k TPM, the provider enforces and
    # states 30 / 20k.  Its headers' limits bind, so rateloop does not pace at the
    # configured ones into a stream of 429s (it was 0.76 refused per success, 78 %).
    result = run_strategy(build_scenario("lower"), "rateloop")
    assert result.completed == 40
    assert result.rejected_per_success < 0.05
    assert result.efficiency > 0.95


# --- the command line -----------------------------------------------------------------

runner = CliRunner()


def test_the_readmes_first_command_simulates_on_embedded_defaults() -> None:
    """``python3 -m rateloop simulate`` as the README runs it: no options, no services."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "rateloop", "simulate"], check=False,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for label in ("immediate retry*", "SDK retries*", "tenacity recipe*", "LiteLLM retries*",
                  "rateloop zero-config"):
        assert label in out
    assert out.count("quota-bound ideal") == 2  # burst and steady
    assert "models of the peers' documented retry behaviour" in out
    rateloop_rows = [line.split() for line in out.splitlines()
                     if line.split()[:1] == ["rateloop"] and "zero-config" not in line]
    assert [row[1] for row in rateloop_rows] == ["40/40", "40/40"]


def test_simulate_json_rows_and_the_honesty_note() -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "burst", "--tasks", "6",
                                 "--calls", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "models of the peers' documented retry behaviour" in data["note"]
    assert [r["strategy"] for r in data["rows"]] == [
        "immediate", "sdk", "tenacity", "litellm", "rateloop", "rateloop-zero"]
    loop = data["rows"][4]
    assert loop["completed"] == 6 and 0 < loop["efficiency"] <= 1


def test_simulate_table() -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "steady", "--tasks", "4",
                                 "--calls", "2", "--strategies", "sdk,rateloop"])
    assert result.exit_code == 0, result.output
    assert "SDK retries*" in result.output and "rateloop" in result.output
    assert "quota-bound ideal" in result.output
    assert "models of the peers'" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "nope"], "--scenario got 'nope'; allowed: burst, steady"),
        (["--strategies", "retry"], "--strategies got 'retry'; allowed: immediate"),
        (["--profile", "x"], "--profile must be one of openai, anthropic, gemini"),
        (["--tasks", "0"], "tasks must be an integer >= 1, got 0"),
        (["--spread", "-1"], "spread must be a number >= 0 (0: every call the mean), got -1.0"),
        (["--output-ratio", "0"], "output_ratio must be a fraction 0 < ratio <= 1, got 0.0"),
        (["--trace", "missing.csv"], "No such file"),
    ],
)
def test_simulate_bad_options(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_simulate_sizes_every_call_alike_with_spread_zero() -> None:
    result = runner.invoke(app, ["simulate", "--plan", "--spread", "0", "--output-ratio", "0.5",
                                 "--input-tokens", "600", "--max-tokens", "400"])
    assert result.exit_code == 0, result.output
    assert "tpm 40,000: needs 200,000 (1,000/call)" in result.output  # 200 calls of 600 + 400


def test_simulate_plan() -> None:
    result = runner.invoke(app, ["simulate", "--plan", "--target", "120"])
    assert result.exit_code == 0, result.output
    assert "finish in 297 s at best (bound by tokens per minute (tpm))" in result.output
    assert "To finish in 120 s" in result.output


def test_simulate_png(tmp_path: Path) -> None:
    out = tmp_path / "sim.png"
    result = runner.invoke(app, ["simulate", "--scenario", "burst", "--tasks", "3",
                                 "--calls", "1", "--png", str(out)])
    if importlib.util.find_spec("matplotlib") is None:
        assert result.exit_code == 2
        assert "--png needs matplotlib: pip install 'rateloop[sim]'" in result.output
        assert not out.exists()
    else:
        assert result.exit_code == 0, result.output
        assert out.read_bytes().startswith(b"\x89PNG")


def test_efficiency_is_never_above_one() -> None:
    scenario = build_scenario("burst", tasks=2, calls=1)
    for strategy in ("rateloop", "sdk"):
        result = run_strategy(scenario, strategy)
        assert 0 <= result.efficiency <= 1
        assert not math.isnan(result.attempts_per_call)


def test_simulate_zero_leaves_a_limit_unset() -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "burst", "--tasks", "3", "--calls",
                                 "1", "--tpm", "0", "--rpm", "0", "--concurrency", "2",
                                 "--strategies", "rateloop", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    # Only the concurrency limit is left: 3 calls 2 at a time are two rounds of 2 s.
    assert row["ideal_secs"] == pytest.approx(4.0)
    assert row["completed"] == 3


def test_simulate_a_trace_of_the_users_calls(tmp_path: Path) -> None:
    trace = tmp_path / "calls.jsonl"
    trace.write_text("".join(
        json.dumps({"task": f"t{i % 4}", "input_tokens": 500, "max_tokens": 300,
                    "output_tokens": 100}) + "\n"
        for i in range(12)
    ))
    result = runner.invoke(app, ["simulate", "--scenario", "burst", "--trace", str(trace),
                                 "--strategies", "rateloop", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)["rows"][0]
    assert row["completed"] == 4  # 4 tasks of 3 calls each
    assert row["provider_attempts"] >= 12
