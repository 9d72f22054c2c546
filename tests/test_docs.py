"""Every ```python block of README.md and docs/*.md runs as written.

The blocks of one file run in order, in one namespace, in a fresh interpreter
whose working directory is the repository root (so ``examples/policy.toml``
resolves), with warnings turned into errors.  Each block is compiled under
its file's name with its own line numbers, so a failure's traceback points
at the line of the page, and the report names the file and the block's first
line.  Use ```text for sample output and ```bash / ```console for shell.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_FENCE = re.compile(r"^```python[ \t]*$\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
TIMEOUT_SECS = 60
#: Pages whose programs start a real engine (a Temporal dev server, Celery and DBOS workers).
PAGE_TIMEOUT_SECS: dict[str, int] = {"docs/engines.md": 240}

#: Pages other helpers own whose blocks still use placeholders on main (strict: when a
#: page is fixed, its entry must go, so the list never hides a page that runs).
KNOWN_FAILING: dict[str, str] = {
}

# Runs in the child: execute every block of one page in one namespace.
_RUNNER = r"""
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__docs__"}
for path, line, source in blocks:
    code = compile("\n" * (line - 1) + source, path, "exec")
    try:
        exec(code, namespace)
    except BaseException:
        print(f"{path}:{line}: this ```python block failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def python_blocks(page: Path) -> list[tuple[str, int, str]]:
    """(relative path, first line of the code, code) of each ```python block."""
    text = page.read_text(encoding="utf-8")
    rel = page.relative_to(ROOT).as_posix()
    return [
        (rel, text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _FENCE.finditer(text)
    ]


def test_the_collector_finds_blocks_and_their_lines(tmp_path: Path) -> None:
    page = ROOT / "README.md"
    blocks = python_blocks(page)
    assert blocks, "README.md has python blocks"
    lines = page.read_text(encoding="utf-8").splitlines()
    for _, line, source in blocks:
        assert lines[line - 2].startswith("```python")
        assert lines[line - 1] == source.splitlines()[0]


def run_page(blocks: list[tuple[str, int, str]]) -> subprocess.CompletedProcess[str]:
    import json

    timeout = max((PAGE_TIMEOUT_SECS.get(path, TIMEOUT_SECS) for path, _, _ in blocks),
                  default=TIMEOUT_SECS)

    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", _RUNNER],
        input=json.dumps(blocks),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_failing_block_is_named_by_file_and_line() -> None:
    blocks = [("docs/x.md", 3, "a = 1\n"), ("docs/x.md", 9, "assert a == 2, 'a is 1'\n")]
    result = run_page(blocks)
    assert result.returncode == 1
    assert "docs/x.md:9: this ```python block failed" in result.stderr
    assert 'File "docs/x.md", line 9' in result.stderr


def _page_param(page: Path) -> object:
    rel = page.relative_to(ROOT).as_posix()
    reason = KNOWN_FAILING.get(rel)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(page, id=rel, marks=marks)


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES])
def test_every_python_block_runs(page: Path) -> None:
    blocks = python_blocks(page)
    if not blocks:
        return  # nothing to run on this page
    result = run_page(blocks)
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-1000:]
