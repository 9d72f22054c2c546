"""Reports of a simulation: the rich table, a JSON summary, and the optional PNG."""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from rateloop.errors import RateloopError
from rateloop.sim.harness import RunResult
from rateloop.sim.scenarios import Scenario
from rateloop.sim.strategies import STRATEGIES

__all__ = ["HONESTY", "MissingExtra", "render_table", "summary", "write_png"]

HONESTY = (
    "* Rows marked * are models of the peers' documented retry behaviour run in this "
    "harness, not the peers' code; bench/sim_crosscheck.py checks the simulator against the "
    "real SDKs over HTTP. Virtual time: the same seed gives the same table."
)


class MissingExtra(RateloopError, RuntimeError):
    """An optional dependency is not installed."""


def duration(seconds: float | None) -> str:
    """``12.3s``, ``5m04s``, ``1h02m``, or ``-``.

    >>> duration(12.34), duration(304), duration(3725), duration(None), duration(math.inf)
    ('12.3s', '5m04s', '1h02m', '-', 'never')
    """
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "never"  # a call larger than a minute's limit: the provider refuses it for good
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        minutes, secs = divmod(round(seconds), 60)
        return f"{minutes}m{secs:02d}s"
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}h{rest // 60:02d}m"


def summary(result: RunResult) -> dict[str, Any]:
    """The row of one run, as JSON-ready numbers."""
    rejected = result.rejected_per_success
    return {
        "scenario": result.scenario,
        "strategy": result.strategy,
        "completed": result.completed,
        "deferred": result.deferred,
        "lost": result.lost,
        "wall_secs": round(result.wall, 3),
        "ideal_secs": None if math.isinf(result.ideal) else round(result.ideal, 3),
        "efficiency": round(result.efficiency, 4),
        "rejected_per_success": None if math.isinf(rejected) else round(rejected, 4),
        "attempts_per_call": round(result.attempts_per_call, 4),
        "p50_task_secs": result.latency(0.5),
        "p95_task_secs": result.latency(0.95),
        "provider_attempts": result.provider_attempts,
        "provider_refusals": result.provider_refusals,
    }


def render_table(scenario: Scenario, results: Sequence[RunResult], console: Console) -> None:
    ideal = duration(results[0].ideal) if results else "-"
    console.print(f"[bold]{scenario.description}[/bold]\n{scenario.limits_text()}\n"
                  f"quota-bound ideal: {ideal}", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("strategy", no_wrap=True)
    for name in ("done", "deferred", "lost", "wall", "effic.", "refused/ok", "tries/call",
                 "p50", "p95"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in results:
        strategy = STRATEGIES[r.strategy]
        rejected = r.rejected_per_success
        table.add_row(
            strategy.label,
            f"{r.completed}/{len(r.tasks)}",
            str(r.deferred),
            str(r.lost),
            duration(r.wall),
            f"{r.efficiency:.0%}",
            "∞" if math.isinf(rejected) else f"{rejected:.2f}",
            f"{r.attempts_per_call:.2f}",
            duration(r.latency(0.5)),
            duration(r.latency(0.95)),
            style=None if strategy.is_model else "bold",
        )
    console.print(table)


def _series(result: RunResult, step: float, end: float) -> dict[str, list[float]]:
    bins = max(1, math.ceil(end / step))
    ok = [0.0] * bins
    refused = [0.0] * bins
    for t, success in result.attempts_log:
        i = min(bins - 1, int(t // step))
        if success:
            ok[i] += 1
        else:
            refused[i] += 1
    waiting = []
    for i in range(bins):
        t = i * step
        waiting.append(float(sum(1 for task in result.tasks if task.start <= t < task.end)))
    return {"ok": [v * 60 / step for v in ok], "refused": [v * 60 / step for v in refused],
            "waiting": waiting}


def write_png(scenario: Scenario, results: Sequence[RunResult], path: Path) -> None:
    """Throughput, rejections and waiting tasks over time, one line per strategy."""
    try:
        # Imported by name: matplotlib is an optional extra without type stubs here.
        importlib.import_module("matplotlib").use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        raise MissingExtra(
            "--png needs matplotlib: pip install 'rateloop[sim]' (or pip install matplotlib)"
        ) from None
    end = max((r.wall for r in results), default=1.0) or 1.0
    step = max(1.0, end / 60)
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for r in results:
        series = _series(r, step, end)
        xs = [i * step for i in range(len(series["ok"]))]
        label = STRATEGIES[r.strategy].label
        axes[0].plot(xs, series["ok"], label=label)
        axes[1].plot(xs, series["refused"], label=label)
        axes[2].plot(xs, series["waiting"], label=label)
    axes[0].set_ylabel("successful calls / min")
    axes[1].set_ylabel("rejected calls / min")
    axes[2].set_ylabel("tasks in progress")
    axes[2].set_xlabel("virtual seconds")
    axes[0].set_title(scenario.description, fontsize=9)
    axes[0].legend(fontsize=8)
    fig.text(0.01, 0.005, "* models of documented peer behaviour, not the peers.",
             fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
