"""``rateloop simulate --scenario ladder``: the degrade ladder beside standard-only and fallback.

Everything runs on virtual time (the simulator's loop): six hours of traffic take seconds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rateloop.cli import app
from rateloop.sim.ladder import (
    LADDER_STRATEGIES,
    LadderScenario,
    render_ladder,
    run_ladder,
)
from rateloop.testing import FakeBatch, FakeLimits

runner = CliRunner()

#: A small version of the scenario for the mechanisms: 40 bulk calls due in 30 minutes.
SMALL = LadderScenario(
    bulk_calls=40, bulk_workers=4, deadline_secs=1800.0, interactive_every=60.0,
    standard=FakeLimits(rpm=2, tpm=40_000), flex=FakeLimits(rpm=1, tpm=40_000),
    small=FakeLimits(rpm=2, tpm=40_000),
    batch=FakeBatch(delay=300.0, item_seconds=1.0, fail_rate=0.2),
)


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, Any]]:
    """The README's table, as the command prints it with ``--json`` (one run for the module)."""
    result = runner.invoke(app, ["simulate", "--scenario", "ladder", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "batch rung is modelled in the simulator" in data["note"]
    assert "peers" not in data["note"]  # the fleet's note belongs to the fleet's table
    return {row["strategy"]: row for row in data["rows"]}


def test_the_table_compares_the_three_strategies(rows: dict[str, dict[str, Any]]) -> None:
    assert list(rows) == list(LADDER_STRATEGIES) == ["standard", "fallback", "ladder"]
    for row in rows.values():
        assert row["scenario"] == "ladder"
        assert row["bulk_calls"] == 1000
        assert row["interactive_calls"] == 720  # one every 30 s for 6 h
        assert row["cost_usd"] > 0


def test_the_standard_tier_alone_cannot_serve_both(rows: dict[str, dict[str, Any]]) -> None:
    standard = rows["standard"]
    assert standard["bulk_done_by_deadline"] < 1000
    assert standard["bulk_finished_secs"] > 6 * 3600
    assert standard["lost"] > 0  # interactive users left unanswered
    assert standard["bulk_on"] == {"standard": 1000}


def test_the_ladder_is_cheaper_in_time_and_loses_nothing(
    rows: dict[str, dict[str, Any]],
) -> None:
    ladder, standard, fallback = rows["ladder"], rows["standard"], rows["fallback"]
    assert ladder["cost_usd"] < standard["cost_usd"]
    assert ladder["cost_usd"] < fallback["cost_usd"]
    assert ladder["interactive_p95_secs"] <= fallback["interactive_p95_secs"]
    assert ladder["interactive_p95_secs"] <= standard["interactive_p95_secs"]
    assert ladder["bulk_done_by_deadline"] == 1000
    assert ladder["bulk_finished_secs"] <= 6 * 3600
    assert ladder["lost"] == 0
    assert ladder["interactive_answered"] == ladder["interactive_calls"]
    # The bulk work went down the ladder: flex first, and the batch rung too.
    assert ladder["bulk_on"]["flex"] > ladder["bulk_on"].get("standard", 0)
    assert ladder["bulk_on"]["batch"] > 0 and ladder["batches"] > 0
    assert sum(ladder["bulk_on"].values()) == 1000
    assert "fallback" not in ladder["bulk_on"]  # the bulk ladder ends at batch
    assert rows["fallback"]["bulk_on"].get("fallback", 0) > 0


def test_the_batch_rung_retries_failed_items_and_prices_them_at_half() -> None:
    result = run_ladder("ladder", SMALL)
    assert result.bulk_done == 40 and result.lost == 0
    assert result.bulk_on["batch"] > 0
    assert result.batches >= 2  # a 5xx item goes again, in a batch of its own round
    # Every bulk call priced: a batch item costs half of the standard price.
    standard = run_ladder("standard", SMALL)
    assert result.cost_usd < standard.cost_usd


def test_a_batch_item_that_fails_every_round_is_lost() -> None:
    always = LadderScenario(
        bulk_calls=SMALL.bulk_calls, bulk_workers=SMALL.bulk_workers,
        deadline_secs=SMALL.deadline_secs, interactive_every=SMALL.interactive_every,
        standard=SMALL.standard, flex=SMALL.flex, small=SMALL.small,
        batch=FakeBatch(delay=300.0, fail_rate=1.0),
    )
    result = run_ladder("ladder", always)
    to_batch = result.bulk_calls - result.bulk_done
    assert to_batch > 0 and "batch" not in result.bulk_on
    assert result.lost == to_batch  # failed three rounds (the batch step's max_rounds)
    assert result.batches >= 3


def test_the_same_seed_gives_the_same_rows() -> None:
    first = run_ladder("ladder", SMALL, seed=3).summary()
    assert run_ladder("ladder", SMALL, seed=3).summary() == first


def test_the_table_shape() -> None:
    results = [run_ladder(name, SMALL) for name in LADDER_STRATEGIES]
    console = Console(width=100, record=True)
    render_ladder(SMALL, results, console)
    text = console.export_text()
    assert "40 bulk calls (background, deferrable, 4 workers) due in 1800 s" in text
    header = next(line for line in text.splitlines() if line.strip().startswith("strategy"))
    assert header.split() == ["strategy", "cost", "bulk", "by", "1800s", "bulk", "ends",
                              "int.", "p95", "refused/ok", "lost"]
    for label in LADDER_STRATEGIES.values():
        assert sum(line.strip().startswith(label + "  ") for line in text.splitlines()) == 2
    assert "bulk calls answered on" in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bulk_calls": 0}, "LadderScenario.bulk_calls must be an integer >= 1, got 0"),
        ({"bulk_workers": 1.5}, "LadderScenario.bulk_workers must be an integer >= 1, got 1.5"),
        ({"deadline_secs": -1}, "LadderScenario.deadline_secs must be a number of seconds > 0"),
        ({"interactive_every": 0}, "interactive_every must be a number of seconds > 0, got 0"),
    ],
)
def test_bad_scenario_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LadderScenario(**options)


def test_an_unknown_strategy_is_named() -> None:
    with pytest.raises(ValueError, match="unknown ladder strategy 'turbo'; allowed: standard, "
                                         "fallback, ladder"):
        run_ladder("turbo", SMALL)


@pytest.mark.parametrize("flag", [["--plan"], ["--png", "out.png"]])
def test_the_ladder_alone_has_no_plan_or_png(flag: list[str]) -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "ladder", *flag])
    assert result.exit_code == 2
    assert "the ladder scenario has neither" in result.output


def test_ladder_is_named_among_the_allowed_scenarios() -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "nope"])
    assert result.exit_code == 2
    assert "lower, shared, ladder, or all" in result.output
