"""Durable tasks under kill -9: the full-size campaign (1,000 five-step tasks, 4 workers).

Usage::

    PYTHONPATH=src python bench/tasks_campaign.py [--store sqlite,postgres] [--tasks 1000]
        [--workers 4] [--kill-every 0.5,2] [--lease 1.0] [--dying-posts 10] [--json out.json]

Real ``rateloop worker`` processes on a real store; a random one is
``kill -9``ed every 0.5–2 s and replaced, and ``--dying-posts`` tasks kill
their own worker right after their non-idempotent write landed.  The harness
and the meaning of every figure are in ``tests/_tasks_campaign.py``; the test
suite runs a small version of it (``tests/test_tasks_campaign.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _tasks_campaign import main

if __name__ == "__main__":
    main()
