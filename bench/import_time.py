"""Start-up cost: ``import rateloop`` against ``import tenacity`` (and stamina), in one run.

Usage::

    python bench/import_time.py [--repeat 40] [--libs rateloop,tenacity,stamina]
        [--src PATH] [--as-is] [--json out.json]

Each sample is a fresh interpreter (``sys.executable -c``) that times one
``import NAME`` with ``perf_counter_ns`` and counts the modules it added to
``sys.modules``: all of them, and the library's own (``NAME`` and
``NAME.*``).  The libraries take turns, sample by sample, so a slow moment of
the machine falls on all of them alike.  The figures are the median and the
spread (the middle half, p25..p75, and min..max) in milliseconds; the ratio
is rateloop's median over tenacity's.

Bytecode: every library reads its ``.pyc`` from one private
``PYTHONPYCACHEPREFIX`` written by a warm-up import before the samples (what
an installed package has; this development machine sets
``PYTHONDONTWRITEBYTECODE=1``, which would otherwise make rateloop, an
editable install, compile from source at every start while the libraries in
site-packages read their caches).  ``--as-is`` keeps the environment as it
is instead (no private prefix): with ``PYTHONDONTWRITEBYTECODE=1`` and an
editable install, rateloop then compiles from source at every start, the
others do not (the condition of this machine's development trees).

``--src`` puts a source tree first on ``PYTHONPATH`` (``--src src`` for a
work tree; ``--src ../main/src`` for the code before a change).  A library
that is not installed is left out with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

_SAMPLE = """
import json, sys, time
before = set(sys.modules)
start = time.perf_counter_ns()
import {name}
elapsed = time.perf_counter_ns() - start
new = set(sys.modules) - before
own = [m for m in new if m == {name!r} or m.startswith({name!r} + ".")]
print(json.dumps({{"ns": elapsed, "modules": len(new), "own": len(own),
                  "file": {name}.__file__}}))
"""


def _env(prefix: str, *, as_is: bool, src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if not as_is:
        env["PYTHONPYCACHEPREFIX"] = prefix
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.abspath(src), *filter(None, [env.get("PYTHONPATH")])]
        )
    return env


def _sample(name: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _SAMPLE.format(name=name)],
        capture_output=True, text=True, env=env, check=True, timeout=120,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _installed(name: str, env: dict[str, str]) -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", f"import {name}"], capture_output=True, env=env, check=False
    )
    return probe.returncode == 0


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def run(libs: list[str], *, repeat: int, as_is: bool, src: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rateloop-pyc-") as prefix:
        env = _env(prefix, as_is=as_is, src=src)
        present = [name for name in libs if _installed(name, env)]
        for name in sorted(set(libs) - set(present)):
            print(f"note: {name} is not installed here; left out", file=sys.stderr)
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in present}
        # The probes above were the warm-up: each wrote its .pyc (unless --as-is).
        for _ in range(repeat):
            for name in present:
                samples[name].append(_sample(name, env))
    report: dict[str, Any] = {
        "python": sys.version.split()[0], "repeat": repeat, "as_is": as_is, "libs": {},
    }
    for name, runs in samples.items():
        ms = [r["ns"] / 1e6 for r in runs]
        report["libs"][name] = {
            "median_ms": statistics.median(ms),
            "p25_ms": _quantile(ms, 0.25),
            "p75_ms": _quantile(ms, 0.75),
            "min_ms": min(ms),
            "max_ms": max(ms),
            "modules": statistics.median(r["modules"] for r in runs),
            "own_modules": statistics.median(r["own"] for r in runs),
            "file": runs[0]["file"],
        }
    libs_out = report["libs"]
    if "rateloop" in libs_out and "tenacity" in libs_out:
        report["ratio_rateloop_over_tenacity"] = (
            libs_out["rateloop"]["median_ms"] / libs_out["tenacity"]["median_ms"]
        )
    return report


def show(report: dict[str, Any]) -> str:
    mode = "the environment as it is" if report["as_is"] else "warm: .pyc caches"
    lines = [
        f"Python {report['python']}, {report['repeat']} fresh interpreters per library, {mode}",
        f"{'import':<10} {'median ms':>9} {'p25..p75 ms':>13} {'min..max ms':>13}"
        f" {'modules':>8} {'own':>5}",
    ]
    for name, row in report["libs"].items():
        lines.append(
            f"{name:<10} {row['median_ms']:>9.1f}"
            f" {row['p25_ms']:>6.1f}..{row['p75_ms']:<6.1f}"
            f" {row['min_ms']:>6.1f}..{row['max_ms']:<6.1f}"
            f" {row['modules']:>8g} {row['own_modules']:>5g}"
        )
    if "ratio_rateloop_over_tenacity" in report:
        ratio = report["ratio_rateloop_over_tenacity"]
        lines.append(f"rateloop / tenacity (medians): {ratio:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40, help="samples per library")
    parser.add_argument("--libs", default="rateloop,tenacity,stamina")
    parser.add_argument("--src", help="a source tree to put first on PYTHONPATH")
    parser.add_argument("--as-is", action="store_true", help="no private bytecode cache")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    report = run(
        [name.strip() for name in args.libs.split(",") if name.strip()],
        repeat=args.repeat, as_is=args.as_is, src=args.src,
    )
    print(show(report))
    for name, row in report["libs"].items():
        print(f"  {name}: {row['file']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
