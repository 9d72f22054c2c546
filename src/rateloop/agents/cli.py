"""``rateloop run``: run a CLI agent step with rate-limit-safe retries.

The command is a thin shell around :func:`rateloop.agents.run_step`: it
stacks the settings (flags > env > policy file > defaults), runs the step,
prints the winning attempt's result on stdout and exits with the code of the
outcome (0, the child's own code, 65, 75 or 124; see ``docs/agents.md``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperOption

from rateloop._redact import redact
from rateloop.agents.command import Agent, step_label
from rateloop.agents.runner import exit_code_for, run_step
from rateloop.agents.settings import (
    SettingsLayer,
    layer_from_env,
    layer_from_policy,
    parse_wait_limit,
    resolve_settings,
)
from rateloop.agents.signals import StepInterrupted, stop_on_signals
from rateloop.agents.step import StepOutput
from rateloop.errors import ConfigError

__all__ = ["EXIT_USAGE", "register"]

#: Bad flags or a bad policy file (click's usage-error code).
EXIT_USAGE = 2

_HELP = """Run COMMAND (a CLI agent step) and retry it when the provider rate limits it.

Put the command after `--`:

    rateloop run --max-retries 3 -- claude -p "fix the failing test"

Only a failed run whose output carries a rate-limit signal is retried, after
min(base·2^(n−1), max) seconds; every other failure stops at once with the
child's exit code.  A usage limit (a quota spent until a later reset) is not
retried, unless --wait-for-reset[=MAX] is given and the reset is at most MAX
away: then the command waits for it and runs once more.

Exit codes: 0 success, the child's code for other failures, 75 when the rate
limit outlasted the retries or a usage quota is spent until a later reset,
124 on timeout, 65 when the result is unusable, 128+N when rateloop run
itself receives signal N (SIGINT 130, SIGTERM 143, SIGHUP 129; the agent's
whole process group is ended first).
"""


#: ``--wait-for-reset`` given without a value.
WAIT_FOR_RESET_DEFAULT = "6h"
_WAIT_FLAG = "--wait-for-reset"


class _RunCommand(TyperCommand):
    """``rateloop run``, with ``--wait-for-reset`` taking an optional value.

    The parser needs every option to either always or never take a value, so
    before parsing a bare ``--wait-for-reset`` is rewritten: to
    ``--wait-for-reset=MAX`` when the next word reads as a wait limit
    (``--wait-for-reset 2h``), else to ``--wait-for-reset=6h`` (so
    ``--wait-for-reset claude -p ...`` runs claude).  Only ``rateloop run``'s
    own options are looked at: the walk stops at ``--`` or at the command.
    """

    # ``ctx`` is the click Context (typer >= 0.16 vendors click privately, so no one name fits).
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._with_wait_value(args))

    def _with_wait_value(self, args: list[str]) -> list[str]:
        takes_value = {
            name
            for param in self.params
            if isinstance(param, TyperOption) and not param.is_flag
            for name in param.opts
        }
        out = list(args)
        i = 0
        while i < len(out):
            word = out[i]
            if word == "--" or not word.startswith("-"):
                break  # the agent command starts here
            if word == _WAIT_FLAG:
                value = WAIT_FOR_RESET_DEFAULT
                if i + 1 < len(out) and _is_wait_limit(out[i + 1]):
                    value = out.pop(i + 1)
                out[i] = f"{_WAIT_FLAG}={value}"
            elif word in takes_value:
                i += 1  # skip the option's value
            i += 1
        return out


def _is_wait_limit(word: str) -> bool:
    try:
        parse_wait_limit(word)
    except ValueError:
        return False
    return True


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to the ``rateloop`` app."""
    app.command(
        "run",
        cls=_RunCommand,
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
    wait_for_reset: Annotated[
        str | None,
        typer.Option(
            "--wait-for-reset",
            metavar="[=MAX]",
            help="On a usage limit whose reset is known and at most MAX away (default 6h;"
            " 90m, 6h, 3600, ...), wait for it with a countdown, then run once more.",
        ),
    ] = None,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue",
            metavar="URL",
            help="On a usage limit, park the step in this task store (sqlite:///path,"
            " postgresql://...) for `rateloop worker` to run at the reset, instead of exit 75.",
        ),
    ] = None,
    stdin: Annotated[
        bool,
        typer.Option(
            "--stdin/--no-stdin",
            help="Read this command's stdin once and feed it to every attempt (default: empty).",
        ),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="End with one JSON line on stderr: status, kind, the allowance that ran out"
            " and its reset as the agent stated them.",
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
    if queue is not None:
        from rateloop.tasks.store import check_store_url

        try:
            check_store_url(queue)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--queue") from None
    reset_limit = None
    if wait_for_reset is not None:
        try:
            reset_limit = parse_wait_limit(wait_for_reset)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--wait-for-reset") from None
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
                wait_for_reset=reset_limit,
            )
    except StepInterrupted as stop:
        # run_attempt has already ended the agent's process group.
        name = label or (step_label(command) if command and command[0] else "the step")
        # After SIGHUP the terminal may be gone: the exit code must survive a failed write.
        ended = (
            "; the agent's process group was ended."
            if stop.agent_ended
            else " while waiting to run it again; no agent was running."
        )
        with contextlib.suppress(OSError, ValueError):
            typer.echo(
                redact(f"Error: {name} stopped: rateloop run received {stop.name}{ended}"),
                err=True,
            )
        raise typer.Exit(stop.exit_code) from None
    if queue is not None and outcome.status.value.startswith("waiting_for_"):
        from rateloop.agents.parked import park_from_cli
        from rateloop.agents.step import RESET_MARGIN_SECS

        raise typer.Exit(park_from_cli(
            queue, command, outcome, margin_secs=RESET_MARGIN_SECS, agent=agent,
            model=model, timeout=timeout, label=label,
        ))
    if outcome.ok and isinstance(outcome.value, str):
        _print_result(outcome.value)
    if as_json:
        from rateloop.agents.summary import step_summary

        with contextlib.suppress(OSError, ValueError):
            typer.echo(redact(json.dumps(step_summary(outcome))), err=True)
    raise typer.Exit(exit_code_for(outcome))


def _print_result(value: str) -> None:
    """The step's result on stdout, the agent's own bytes unchanged (never re-encoded)."""
    data = value.data if isinstance(value, StepOutput) else value.encode("utf-8")
    out = sys.stdout
    out.flush()
    out.buffer.write(data)
    out.buffer.flush()
