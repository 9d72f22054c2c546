"""The ``rateloop`` command line.

Each area registers its own commands (``classify``, ``config``, ``run``); this
module only assembles them.
"""

from __future__ import annotations

import typer

from rateloop import __version__
from rateloop.agents.cli import register as _register_run
from rateloop.classify.cli import register as _register_classify
from rateloop.observe.cli import register_dashboard as _register_dashboard
from rateloop.observe.cli import register_status as _register_status
from rateloop.policy.cli import register as _register_config
from rateloop.sim.cli import register as _register_simulate
from rateloop.tasks.cli import register_tasks as _register_tasks
from rateloop.tasks.cli import register_worker as _register_worker
from rateloop.testing._fake.cli import register as _register_fake_provider

app = typer.Typer(
    name="rateloop",
    no_args_is_help=True,
    add_completion=False,
    help="Keep AI agents working when providers push back: Read, Admit, Time, Exit.",
)


def _load_parked_agent_step() -> object:
    """The parked CLI agent step (``rateloop run --queue``): every worker can run it."""
    from rateloop.agents import parked

    return parked


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"rateloop {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        callback=_show_version,
        is_eager=True,
    ),
) -> None:
    """Keep AI agents working when providers push back."""


_register_classify(app)
_register_config(app)
_register_run(app)
_register_status(app)
_register_dashboard(app)
_register_fake_provider(app)
_register_worker(app, builtin_tasks=[_load_parked_agent_step])
_register_tasks(app)
_register_simulate(app)


def main() -> None:
    """Entry point of the ``rateloop`` console script."""
    app(prog_name="rateloop")
