"""``rateloop run``: run a CLI agent step with rate-limit-safe retries.

The command is a thin shell around :func:`rateloop.agents.run_step`: it
stacks the settings (flags > env > policy file > defaults), runs the step,
prints the winning attempt's result on stdout and exits with the code of the
outcome (0, the child's own code, 65, 75 or 124; see ``docs/agents.md``).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from rateloop.agents.command import Agent, step_label
from rateloop.agents.runner import exit_code_for, run_step
from rateloop.agents.settings import (
    SettingsLayer,
    layer_from_env,
    layer_from_policy,
    resolve_settings,
)
from rateloop.agents.signals import StepInterrupted, stop_on_signals
from rateloop.errors import ConfigError

__all__ = ["EXIT_USAGE", "register"]

#: Bad flags or a bad policy file (click's usage-error code).
EXIT_USAGE = 2

_HELP = """Run COMMAND (a CLI agent step) and retry it when the provider rate limits it.

Put the command after `--`:

    rateloop run --max-retries 3 -- claude -p "fix the failing test"

Only a failed run whose output carries a rate-limit signal is retried, after
min(base·2^(n−1), max) seconds; every other failure stops at once with the
child's exit code.  Exit codes: 0 success, the child's code for other
failures, 75 when the rate limit outlasted the retries or a usage quota is
spent until a later reset, 124 on timeout, 65 when the result is unusable,
128+N when rateloop run itself receives signal N (SIGINT 130, SIGTERM 143,
SIGHUP 129; the agent's whole process group is ended first).
"""


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to the ``rateloop`` app."""
    app.command(
        "run",
        help=_HELP,
        no_args_is_help=True,
        context_settings={"allow_interspersed_args": False},
    )(run_command)


def run_command(
    *,
    command: Annotated[
        list[str],
        typer.Argument(metavar="COMMAND", help="The agent command and its arguments, after `--`."),
    ],
    agent: Annotated[
        Agent | None,
        typer.Option(
            "--agent",
            case_sensitive=False,
            help="Which agent runs (default: inferred from the command, or its first argument).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Pass `--model M` to the agent on every attempt."),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout", help="Seconds each attempt may run before it is killed (exit 124)."
        ),
    ] = None,
    label: Annotated[
        str | None,
        typer.Option("--label", help="The step's name in messages (default: the command's name)."),
    ] = None,
    policy: Annotated[
        Path | None,
        typer.Option(
            "--policy", help="A policy file (TOML or YAML); its \\[agents] table is read."
        ),
    ] = None,
    max_retries: Annotated[
        int | None,
        typer.Option("--max-retries", help="Retries after the first run (default 5, at most 100)."),
    ] = None,
    base_delay_secs: Annotated[
        float | None,
        typer.Option(
            "--base-delay-secs", help="Wait before the first retry (default 60; 0: no waits)."
        ),
    ] = None,
    max_delay_secs: Annotated[
        float | None,
        typer.Option(
            "--max-delay-secs", help="Longest single wait (default 600; at least the base)."
        ),
    ] = None,
    fallback_auto_model: Annotated[
        bool | None,
        typer.Option(
            "--fallback-auto-model/--no-fallback-auto-model",
            help="Run the last retry on `--model auto` (claude and copilot only).",
        ),
    ] = None,
    stdin: Annotated[
        bool,
        typer.Option(
            "--stdin/--no-stdin",
            help="Read this command's stdin once and feed it to every attempt (default: empty).",
        ),
    ] = False,
) -> None:
    for name, value in (
        ("--timeout", timeout),
        ("--base-delay-secs", base_delay_secs),
        ("--max-delay-secs", max_delay_secs),
    ):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise typer.BadParameter(
                f"must be a finite number >= 0, got {value!r}", param_hint=name
            )
    if timeout is not None and timeout == 0:
        raise typer.BadParameter("must be > 0 seconds, got 0", param_hint="--timeout")
    try:
        policy_layer = layer_from_policy(policy) if policy is not None else None
    except (ConfigError, OSError) as exc:
        typer.echo(f"Error: policy file {policy}: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from exc
    settings = resolve_settings(
        flags=SettingsLayer(
            max_retries=max_retries,
            base_delay_secs=base_delay_secs,
            max_delay_secs=max_delay_secs,
            fallback_auto_model=fallback_auto_model,
        ),
        env=layer_from_env(os.environ),
        policy=policy_layer,
    )
    try:
        with stop_on_signals():
            outcome = run_step(
                command,
                agent=agent,
                model=model,
                timeout=timeout,
                label=label,
                settings=settings,
                input=sys.stdin.buffer.read() if stdin else None,
            )
    except StepInterrupted as stop:
        # run_attempt has already ended the agent's process group.
        name = label or (step_label(command) if command and command[0] else "the step")
        typer.echo(
            f"Error: {name} stopped: rateloop run received {stop.name};"
            " the agent's process group was ended.",
            err=True,
        )
        raise typer.Exit(stop.exit_code) from None
    if outcome.ok and isinstance(outcome.value, str):
        sys.stdout.write(outcome.value)
        sys.stdout.flush()
    raise typer.Exit(exit_code_for(outcome))
