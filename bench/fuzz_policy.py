"""Fuzz the policy loader: N random policy documents, count every crash that is not a ConfigError.

Usage (from the repository root)::

    PYTHONPATH=src python3 bench/fuzz_policy.py               # 5 000 documents, seed 22
    PYTHONPATH=src python3 bench/fuzz_policy.py --n 500 --seed 7

The documents come from ``tests/_policy_docs.py`` (the strategy the test suite
runs, bounded, in ``tests/test_policy_fuzz.py``): every table the schema
knows, filled with values of the wrong kind, empty and unknown keys, numbers
past every bound, mixed-case URL schemes and junk nested where a leaf
belongs.  Each document is loaded with ``Policy.from_dict``; a load may
succeed or raise ``ConfigError``, and anything else is a crash; a document
with an empty key anywhere that loads is counted too (an empty key is an
error).  The last line gives both numbers (must be 0); the exit status is 1
when either is not, and the distinct crashes are listed with one document each.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _policy_docs import policy_documents
from rateloop.errors import ConfigError
from rateloop.policy import Policy


def _empty_key(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k == "" or _empty_key(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_empty_key(v) for v in value)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=22)
    args = parser.parse_args()

    loaded = refused = silent = 0
    crashes: Counter[str] = Counter()
    sample: dict[str, Any] = {}

    @seed(args.seed)
    @settings(
        max_examples=args.n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(doc=policy_documents())
    def run(doc: dict[Any, Any]) -> None:
        nonlocal loaded, refused, silent
        try:
            Policy.from_dict(doc, source="fuzz")
        except ConfigError:
            refused += 1
            return
        except Exception as exc:
            kind = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
            crashes[kind] += 1
            sample.setdefault(kind, doc)
            return
        loaded += 1
        silent += _empty_key(doc)

    started = time.perf_counter()
    run()
    secs = time.perf_counter() - started
    for kind, count in crashes.most_common():
        print(f"{count:6d}  {kind}\n        e.g. {sample[kind]!r:.300}")
    total = loaded + refused + sum(crashes.values())
    print(
        f"{total} documents (seed {args.seed}) in {secs:.1f} s: {loaded} loaded, "
        f"{refused} ConfigError, {sum(crashes.values())} crashes "
        f"({len(crashes)} distinct), {silent} loaded with an empty key"
    )
    return 1 if crashes or silent else 0


if __name__ == "__main__":
    sys.exit(main())
