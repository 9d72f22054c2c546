"""``rateloop simulate``: a fleet on virtual time, rateloop beside the retry baselines.

With no options it runs the ``burst`` and ``steady`` scenarios on embedded
defaults in a few seconds, with no services and no keys.  ``--plan`` prints
the capacity plan instead (``--target`` asks what limits a completion time
needs).  ``--json`` prints the rows as JSON; ``--png FILE`` draws them (needs
the ``sim`` extra: matplotlib).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rateloop.sim.harness import run_strategy
from rateloop.sim.ladder import (
    LADDER_NOTE,
    LADDER_STRATEGIES,
    LadderScenario,
    render_ladder,
    run_ladder,
)
from rateloop.sim.plan import plan_capacity
from rateloop.sim.report import HONESTY, MissingExtra, render_table, summary, write_png
from rateloop.sim.scenarios import SCENARIOS, Scenario, build_scenario
from rateloop.sim.strategies import STRATEGIES
from rateloop.sim.workload import Workload, load_trace
from rateloop.testing._fake.buckets import PROFILES

__all__ = ["register"]


def _names(raw: str, allowed: tuple[str, ...], what: str) -> list[str]:
    if raw == "all":
        return list(allowed)
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"--{what} got {raw!r}; allowed: {', '.join(allowed)}, or all "
                         "(comma-separated)")
    return names


def simulate_command(
    scenario: Annotated[str, typer.Option(
        help="Comma-separated scenarios, or all: " + ", ".join(SCENARIOS) + ", ladder (the "
             "degrade ladder: its own work and strategies; --seed and --json apply).")
    ] = "burst,steady",
    strategies: Annotated[str, typer.Option(
        help="Comma-separated strategies, or all: " + ", ".join(STRATEGIES) + ".")] = "all",
    tasks: Annotated[int, typer.Option(help="Agent tasks in the fleet.")] = 40,
    calls: Annotated[int, typer.Option(help="Model calls per task.")] = 5,
    profile: Annotated[str, typer.Option(
        help="Provider shape and token counting: " + ", ".join(PROFILES) + ".")] = "openai",
    rpm: Annotated[int | None, typer.Option(
        help="Provider requests per minute (0: unlimited).")] = 60,
    tpm: Annotated[int | None, typer.Option(
        help="Provider tokens per minute (0: unlimited).")] = 40_000,
    itpm: Annotated[int | None, typer.Option(help="Provider input tokens per minute.")] = None,
    otpm: Annotated[int | None, typer.Option(help="Provider output tokens per minute.")] = None,
    rpd: Annotated[int | None, typer.Option(help="Provider requests per day.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Provider concurrency limit.")] = None,
    burst: Annotated[float, typer.Option(help="Seconds of each limit usable at once.")] = 5.0,
    latency: Annotated[float, typer.Option(help="Seconds each answer takes.")] = 2.0,
    input_tokens: Annotated[int, typer.Option(help="Mean input tokens per call.")] = 600,
    max_tokens: Annotated[int, typer.Option(help="Mean max output tokens per call.")] = 400,
    spread: Annotated[float, typer.Option(
        help="Spread of the token sizes (the lognormal's sigma; 0: every call the mean).")] = 0.5,
    output_ratio: Annotated[float, typer.Option(
        help="Output tokens produced as a fraction of max_tokens (0 < ratio <= 1).")] = 0.6,
    trace: Annotated[Path | None, typer.Option(
        help="A CSV or JSONL trace of calls (input_tokens, max_tokens[, output_tokens, "
             "task, start]) instead of generated tasks.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the workload and the jitter.")] = 1,
    plan: Annotated[bool, typer.Option(
        "--plan", help="Print the capacity plan instead of simulating.")] = False,
    target: Annotated[float | None, typer.Option(
        help="With --plan: the completion time (seconds) to plan the limits for.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    png: Annotated[Path | None, typer.Option(
        help="Draw throughput, rejections and waiting tasks to this PNG (needs matplotlib: "
             "the 'sim' extra).")] = None,
) -> None:
    """Simulate a fleet on virtual time: rateloop beside retry baselines, on your limits."""
    console = Console()
    if not console.is_terminal and console.width < 100:
        console = Console(width=100)  # piped: room for the whole table
    try:
        if profile not in PROFILES:
            raise ValueError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        # 0 leaves a limit unset (the defaults set --rpm and --tpm).
        rpm, tpm, itpm, otpm, rpd, concurrency = (
            v or None for v in (rpm, tpm, itpm, otpm, rpd, concurrency)
        )
        scenarios = _names(scenario, (*SCENARIOS, "ladder"), "scenario")
        ladder = "ladder" in scenarios
        scenarios = [name for name in scenarios if name != "ladder"]
        if ladder and not scenarios and (plan or png is not None):
            raise ValueError("--plan and --png take the fleet scenarios "
                             f"({', '.join(SCENARIOS)}); the ladder scenario has neither")
        chosen = _names(strategies, tuple(STRATEGIES), "strategies")
        workload: Workload | None = load_trace(trace) if trace is not None else None
        built: list[Scenario] = [
            build_scenario(name, tasks=tasks, calls=calls, profile=profile, rpm=rpm, tpm=tpm,
                           itpm=itpm, otpm=otpm, rpd=rpd, concurrency=concurrency,
                           burst_seconds=burst, latency=latency, input_tokens=input_tokens,
                           max_tokens=max_tokens, spread=spread, output_ratio=output_ratio,
                           workload=workload, seed=seed)
            for name in scenarios
        ]
        if plan and built:
            first = built[0]
            result = plan_capacity(first.workload, first.limits, profile=profile,
                                   latency=latency, target_secs=target)
            for line in result.lines():
                console.print(line, highlight=False)
            return
        if png is not None:
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:
                raise MissingExtra("--png needs matplotlib: pip install 'rateloop[sim]' "
                                   "(or pip install matplotlib)")
    except (ValueError, OSError, MissingExtra) as exc:
        typer.echo(f"rateloop simulate: {exc}", err=True)
        raise typer.Exit(2) from None

    rows = []
    for sc in built:
        results = [run_strategy(sc, name, seed=seed) for name in chosen]
        rows += [summary(r) for r in results]
        if not as_json:
            render_table(sc, results, console)
        if png is not None:
            out = png if len(built) == 1 else png.with_name(f"{png.stem}-{sc.name}{png.suffix}")
            write_png(sc, results, out)
            if not as_json:
                console.print(f"wrote {out}", highlight=False)
    if ladder:
        ladder_rows = [run_ladder(name, seed=seed) for name in LADDER_STRATEGIES]
        rows += [r.summary() for r in ladder_rows]
        if not as_json:
            render_ladder(LadderScenario(), ladder_rows, console)
            console.print(LADDER_NOTE, style="italic", highlight=False)
    if as_json:
        note = " ".join(([HONESTY] if built else []) + ([LADDER_NOTE] if ladder else []))
        sys.stdout.write(json.dumps({"note": note, "rows": rows}, indent=2) + "\n")
    elif built:
        console.print(HONESTY, style="italic", highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``rateloop simulate`` to the ``rateloop`` app."""
    app.command(name="simulate")(simulate_command)
