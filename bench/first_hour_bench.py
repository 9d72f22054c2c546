"""The first-hour program: 50 concurrent chat calls against a rate-limited provider.

Each strategy runs the same user program — 50 threads each making one
``chat.completions`` call — against a fresh :class:`FakeProviderServer` on
127.0.0.1 that enforces OpenAI-style request limits (``--rpm``, a
``--burst``-second bucket, refused requests still spend a slot, as OpenAI's
do) and answers with OpenAI's headers.  Strategies:

* ``plain``     — the SDK as installed (its default 2 retries);
* ``tenacity``  — the usual ``@retry`` around the call (SDK retries off);
* ``litellm``   — a LiteLLM ``Router`` with ``num_retries`` and the model's ``rpm``;
* ``rateloop``  — ``rateloop.openai_client()`` instead of ``openai.OpenAI()``.

Reported per strategy: calls completed and lost (raised to the user), wall
time, 429s the server sent per success, requests per success, and the lines
of glue the strategy added to the plain program (counted from the snippets
below, which are the code that runs).

    python bench/first_hour_bench.py                       # all four
    python bench/first_hour_bench.py --only rateloop --rpm 120 --burst 5
    python bench/first_hour_bench.py --free-refusals   # refusals cost the client nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

from rateloop.testing import FakeProvider, FakeProviderServer

MESSAGES = [{"role": "user", "content": "Summarise the plot of Hamlet in one line."}]

# The user's program, as they would write it.  Every strategy defines ``call()``.
PLAIN = '''
import openai
client = openai.OpenAI(base_url=URL, api_key="sk-fake")
def call():
    return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=50)
'''

TENACITY = '''
import openai
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential
client = openai.OpenAI(base_url=URL, api_key="sk-fake", max_retries=0)
@retry(wait=wait_random_exponential(min=1, max=60), stop=stop_after_attempt(6),
       retry=retry_if_exception_type(openai.RateLimitError))
def call():
    return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=50)
'''

LITELLM = '''
from litellm import Router
router = Router(model_list=[{"model_name": "gpt-4o-mini", "litellm_params": {
    "model": "openai/gpt-4o-mini", "api_base": URL, "api_key": "sk-fake", "rpm": RPM}}],
    num_retries=5)
def call():
    return router.completion(model="gpt-4o-mini", messages=MESSAGES, max_tokens=50)
'''

RATELOOP = '''
import rateloop
client = rateloop.openai_client(base_url=URL, api_key="sk-fake")
def call():
    return client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=50)
'''

STRATEGIES = {"plain": PLAIN, "tenacity": TENACITY, "litellm": LITELLM, "rateloop": RATELOOP}


def glue_lines(snippet: str) -> int:
    """Lines of ``snippet`` that are not in the plain program (changed or added)."""
    plain = {line.strip() for line in PLAIN.strip().splitlines()}
    return sum(1 for line in snippet.strip().splitlines() if line.strip() not in plain)


def run(
    name: str, *, calls: int, rpm: int, burst: float, latency: float, free_refusals: bool
) -> dict[str, Any]:
    provider = FakeProvider(profile="openai", rpm=rpm, burst_seconds=burst, latency=latency,
                            model="gpt-4o-mini", rejected_spends_request=not free_refusals)
    with FakeProviderServer(provider) as server:
        scope: dict[str, Any] = {"URL": server.url + "/v1", "MESSAGES": MESSAGES, "RPM": rpm}
        exec(STRATEGIES[name], scope)
        call = scope["call"]
        errors: list[str] = []

        def one(_: int) -> bool:
            try:
                call()
                return True
            except Exception as exc:
                errors.append(type(exc).__name__)
                return False

        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=calls) as pool:
            results = list(pool.map(one, range(calls)))
        wall = time.monotonic() - start
        stats = provider.stats
    completed = sum(results)
    refused = stats.refused
    return {
        "strategy": name,
        "completed": completed,
        "lost": calls - completed,
        "wall_s": round(wall, 1),
        "429_per_success": round(refused / completed, 3) if completed else None,
        "requests_per_success": round(stats.attempts / completed, 2) if completed else None,
        "server_requests": stats.attempts,
        "glue_lines": glue_lines(STRATEGIES[name]),
        "errors": sorted(set(errors)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rpm", type=int, default=120)
    parser.add_argument("--burst", type=float, default=5.0, help="seconds of rpm spendable at once")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per answer")
    parser.add_argument("--free-refusals", action="store_true",
                        help="a refused request does not spend a slot (OpenAI's do)")
    parser.add_argument("--only", choices=sorted(STRATEGIES), action="append")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    rows = []
    for name in args.only or list(STRATEGIES):
        try:
            row = run(name, calls=args.calls, rpm=args.rpm, burst=args.burst,
                      latency=args.latency, free_refusals=args.free_refusals)
        except ImportError as exc:
            row = {"strategy": name, "error": f"not installed: {exc}"}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    header = ("strategy", "completed", "lost", "wall_s", "429_per_success",
              "requests_per_success", "glue_lines")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row.get(k, row.get("error", ""))) for k in header))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "rows": rows}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
