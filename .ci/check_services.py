"""Fail when service or engine tests were skipped, or when none of them ran.

Reads the JUnit XML that pytest wrote.  A test counts as a service test when its name or
class names the service (``redis`` / ``postgres`` / ``rabbitmq``, or the engine:
``temporal`` / ``celery`` / ``dbos``) or when its skip message does.  Every one of them must
exist and run: optional for users, required in CI (the Temporal dev server is started by the
tests themselves).
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

SERVICES = {"redis": ("redis",), "postgres": ("postgres", "psycopg", "pg_"),
            "rabbitmq": ("rabbitmq",), "temporal": ("temporal",), "celery": ("celery",),
            "dbos": ("dbos",)}
REQUIRED = set(SERVICES)  # services with tests: none running is a failure


def main(path: str) -> int:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"CI: cannot read the JUnit report {path}: {exc}", file=sys.stderr)
        return 1
    cases = list(root.iter("testcase"))
    if not cases:
        print("CI: the JUnit report lists no tests.", file=sys.stderr)
        return 1
    failed = False
    for service, needles in SERVICES.items():
        ran = skipped = 0
        for case in cases:
            name = f"{case.get('classname', '')}::{case.get('name', '')}".lower()
            skip = case.find("skipped")
            message = (skip.get("message", "") if skip is not None else "").lower()
            if not any(n in name or n in message for n in needles):
                continue
            if skip is not None:
                skipped += 1
                print(f"CI: {service} test skipped: {name}: {message}", file=sys.stderr)
            else:
                ran += 1
        print(f"CI: {service} tests run: {ran}, skipped: {skipped}")
        if skipped or (service in REQUIRED and ran == 0):
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
