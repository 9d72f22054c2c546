"""``rateloop config``: check policy files, and show the schedule of waits they produce.

``rateloop config check FILE…`` layers the files in order over the defaults
and prints every effective value with the layer it came from, then any lock
warnings; on a bad file it prints every error (``rateloop: invalid policy: N
errors``, then one line each) and exits 2, the usage-error code.

``rateloop config schedule [FILE…]`` prints the backoff table: for each retry
the formula, its capped value and the range of the wait once jitter is
applied, identical trailing rows collapsed (``5..19  capped at 60  [30, 60]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from rateloop._redact import redact_url
from rateloop.errors import ConfigError
from rateloop.policy import Layer, Policy
from rateloop.route import Route
from rateloop.timing.backoff import Backoff

__all__ = ["EXIT_INVALID", "register", "schedule_rows"]

#: A policy that does not load: bad input, click's usage-error code (not 1, a crash's).
EXIT_INVALID = 2

config_app = typer.Typer(
    name="config",
    no_args_is_help=True,
    add_completion=False,
    help="Check policy files and show the waits they produce.",
)

_FILES_HELP = (
    "Policy files, layered in order over the defaults: .toml, .yaml/.yml, "
    "or pyproject.toml (its \\[tool.rateloop] table)."
)


def register(app: typer.Typer) -> None:
    """Add ``rateloop config`` to the ``rateloop`` app."""
    app.add_typer(config_app, name="config")


def _load(files: Sequence[Path]) -> Policy:
    """The layered policy, or every error printed and exit 2."""
    layers = [Layer.defaults()]
    errors: list[ConfigError] = []
    for path in files:
        try:
            layers.append(Layer.from_file(path))
        except ConfigError as exc:
            errors.extend(exc.errors)
    # Files that parsed are validated even when another did not, so one run shows everything.
    try:
        policy = Policy.layered(*layers)
    except ConfigError as exc:
        errors.extend(exc.errors)
    if not errors:
        return policy
    noun = "error" if len(errors) == 1 else "errors"
    typer.echo(f"rateloop: invalid policy: {len(errors)} {noun}", err=True)
    for err in errors:
        typer.echo(f"  {err}", err=True)
    raise typer.Exit(EXIT_INVALID)


def _show(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{redact_url(value)}"'
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Route):
        return value.scope
    if isinstance(value, frozenset):
        value = sorted(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]) for r in rows
    ]


@config_app.command("check")
def check(
    files: Annotated[list[Path], typer.Argument(metavar="FILE...", help=_FILES_HELP)],
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 when a lock warning is reported.")
    ] = False,
) -> None:
    """Validate policy files and print the effective policy, value by value."""
    policy = _load(files)
    order = " < ".join(["defaults", *(_source(p) for p in files)])
    typer.echo(f"effective policy ({order}):")
    rows = [
        (f"{path} = {_show(value)}", policy.provenance.get(path, "defaults"))
        for path, value in policy.leaves().items()
    ]
    width = min(max(len(left) for left, _ in rows), 64)
    for left, source in rows:
        typer.echo(f"  {left.ljust(width)}  # {source}")
    if policy.warnings:
        noun = "warning" if len(policy.warnings) == 1 else "warnings"
        typer.echo(f"{len(policy.warnings)} lock {noun} (changes not applied):")
        for warning in policy.warnings:
            typer.echo(f"  {warning}")
        if strict:
            raise typer.Exit(1)
    else:
        typer.echo("no lock warnings")


def _source(path: Path) -> str:
    return f"{path} [tool.rateloop]" if path.name == "pyproject.toml" else str(path)


def _fmt(seconds: float) -> str:
    return f"{seconds:g}"


def _base_text(backoff: Backoff, n: int) -> str:
    base = backoff.base(n) if backoff.strategy != "decorrelated" else None
    if base is not None and base >= backoff.max_delay:
        return f"capped at {_fmt(backoff.max_delay)}"
    if base is None or backoff.strategy == "constant":
        return backoff.formula_at(n)
    return f"{backoff.formula_at(n)} = {_fmt(base)}"


def schedule_rows(backoff: Backoff, retries: int) -> list[tuple[str, str, float, float]]:
    """``(retries, base, low, high)`` for retry 1..``retries``; identical runs collapsed."""
    rows: list[tuple[int, int, str, float, float]] = []
    for n in range(1, retries + 1):
        text = _base_text(backoff, n)
        low, high = backoff.bounds(n)
        if rows and rows[-1][2:] == (text, low, high):
            rows[-1] = (rows[-1][0], n, text, low, high)
        else:
            rows.append((n, n, text, low, high))
    return [(str(a) if a == b else f"{a}..{b}", text, low, high) for a, b, text, low, high in rows]


@config_app.command("schedule")
def schedule(
    files: Annotated[
        list[Path] | None, typer.Argument(metavar="[FILE...]", help=_FILES_HELP)
    ] = None,
) -> None:
    """Print the waits a policy produces: retry n, the formula, the range after jitter."""
    files = files or []
    policy = _load(files)
    backoff = policy.backoff()
    retries = policy.max_attempts - 1
    typer.echo(f"policy: {' < '.join(['defaults', *(_source(p) for p in files)])}")
    typer.echo(f"backoff: {backoff.describe()}")
    if retries < 1:
        typer.echo("no retries: max_attempts is 1")
        return
    header = ("retry", "base (s)", f"wait after {backoff.jitter} jitter (s)")
    body = [
        (n, text, f"[{_fmt(low)}, {_fmt(high)}]")
        for n, text, low, high in schedule_rows(backoff, retries)
    ]
    for line in _table([header, *body]):
        typer.echo(line)
    worst = sum(backoff.bounds(n)[1] for n in range(1, retries + 1))
    budget = policy.recovery_budget_secs
    verdict = (
        f"beyond the recovery budget of {_fmt(budget)} s: the loop stops when it runs out"
        if worst > budget
        else f"within the recovery budget of {_fmt(budget)} s"
    )
    typer.echo(f"longest total wait over {retries} retries: {_fmt(worst)} s, {verdict}")
    limit = policy.pause_limit_secs
    if worst_single(backoff, retries) > limit:
        typer.echo(f"waits above the pause limit ({_fmt(limit)} s) are capped at it.")
    typer.echo(
        "a server minimum m (Retry-After) is a floor: max(wait, m) + U(0, wait/2); "
        f"an m above the pause limit ({_fmt(limit)} s) falls back at once, or stops."
    )


def worst_single(backoff: Backoff, retries: int) -> float:
    """The longest single wait the backoff may draw over ``retries`` retries."""
    return max((backoff.bounds(n)[1] for n in range(1, retries + 1)), default=0.0)
