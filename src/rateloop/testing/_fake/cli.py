"""``rateloop fake-provider``: run a FakeProvider as a server on 127.0.0.1.

Point an SDK at it (``OpenAI(base_url=URL + "/v1")``, ``Anthropic(base_url=URL)``)
and watch it refuse the way a provider does.  ``GET /fake/stats`` shows the
counters.  Stops on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

import typer

from rateloop.testing._fake.buckets import PROFILES, FakeLimits
from rateloop.testing._fake.model import FAULTS
from rateloop.testing._fake.provider import FakeProvider
from rateloop.testing._fake.server import serve

__all__ = ["parse_fault_rates", "register"]


def parse_fault_rates(items: list[str]) -> dict[str, float]:
    """``["overload=0.1", "reset=0.01"]`` -> ``{"overload": 0.1, "reset": 0.01}``."""
    rates: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in FAULTS:
            raise ValueError(
                f"--fault-rate takes NAME=PROBABILITY with NAME one of {', '.join(FAULTS)}, "
                f"got {item!r}"
            )
        try:
            rates[name] = float(value)
        except ValueError:
            raise ValueError(f"--fault-rate {item!r}: {value!r} is not a number") from None
    return rates


def fake_provider_command(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8787,
    profile: Annotated[str, typer.Option(help="Default shape and token counting: "
                                         + ", ".join(PROFILES) + ".")] = "openai",
    rpm: Annotated[int | None, typer.Option(
        help="Requests per minute (unset or 0: unlimited).")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens (input+output) per minute.")] = None,
    itpm: Annotated[int | None, typer.Option(help="Input tokens per minute.")] = None,
    otpm: Annotated[int | None, typer.Option(help="Output tokens per minute.")] = None,
    rpd: Annotated[int | None, typer.Option(help="Requests per UTC day.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Requests in flight at once.")] = None,
    burst: Annotated[float, typer.Option(help="Seconds of each limit usable at once.")] = 5.0,
    latency: Annotated[float, typer.Option(help="Seconds each answer takes.")] = 0.0,
    refusal_latency: Annotated[float, typer.Option(
        help="Seconds each refusal takes.")] = 0.0,
    rejected_spends_request: Annotated[bool, typer.Option(
        help="A refused request still spends a request slot (as providers count them).")] = True,
    output_ratio: Annotated[float, typer.Option(
        help="Output tokens produced as a fraction of max_tokens (0..1).")] = 1.0,
    fault_rate: Annotated[list[str] | None, typer.Option(
        help="NAME=PROBABILITY, repeatable; NAME one of " + ", ".join(FAULTS) + ".")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random faults.")] = 0,
    model: Annotated[str, typer.Option(help="Model name in the answers.")] = "fake-model",
) -> None:
    """Run a fake model provider that enforces limits like the real ones (on 127.0.0.1)."""
    # 0 leaves a limit unset, as in ``rateloop simulate``.
    rpm, tpm, itpm, otpm, rpd, concurrency = (
        v or None for v in (rpm, tpm, itpm, otpm, rpd, concurrency)
    )
    try:
        if profile not in PROFILES:
            raise ValueError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        limits = FakeLimits(rpm=rpm, tpm=tpm, itpm=itpm, otpm=otpm, rpd=rpd,
                            concurrency=concurrency, burst_seconds=burst)
        provider = FakeProvider(profile=profile, limits=limits, latency=latency,
                                refusal_latency=refusal_latency, output_ratio=output_ratio,
                                rejected_spends_request=rejected_spends_request,
                                fault_rates=parse_fault_rates(fault_rate or []), seed=seed,
                                model=model)
    except ValueError as exc:
        typer.echo(f"rateloop fake-provider: {exc}", err=True)
        raise typer.Exit(2) from None

    def started(bound: int) -> None:
        url = f"http://127.0.0.1:{bound}"
        typer.echo(f"{provider!r} listening on {url}")
        typer.echo(f"  OpenAI:    OpenAI(base_url='{url}/v1', api_key='fake')")
        typer.echo(f"  Anthropic: Anthropic(base_url='{url}', api_key='fake')")
        typer.echo(f"  counters:  curl {url}/fake/stats")

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(provider, host="127.0.0.1", port=port, started=started))
    except OSError as exc:  # the port is taken, or not ours to bind
        typer.echo(f"rateloop fake-provider: cannot listen on 127.0.0.1:{port}: "
                   f"{exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    """Add ``rateloop fake-provider`` to the ``rateloop`` app."""
    app.command(name="fake-provider")(fake_provider_command)
