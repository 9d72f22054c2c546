"""ADMIT's floor plan: module sizes, one-way imports, leaf registries, one key layout.

Static checks over the source of ``rateloop.admission`` (every import, at module
level or not, under ``TYPE_CHECKING`` or not), plus a fresh interpreter for what
importing a module loads.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

import rateloop.admission
from rateloop.admission.backends import keys
from rateloop.admission.backends.scripts import script_text
from rateloop.observe import redis_state

ROOT = Path(rateloop.admission.__file__).parent
PACKAGE = "rateloop.admission"
MODULES = {
    ".".join((PACKAGE, *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): p
    for p in sorted(ROOT.rglob("*.py"))
}


def imports_of(module: str) -> set[str]:
    """Every ``rateloop.admission`` module ``module`` imports, wherever the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            base = node.module
            if node.level:  # relative: resolve against the importing package
                parts = module.split(".")
                if MODULES[module].name != "__init__.py":
                    parts = parts[:-1]
                base = ".".join([*parts[: len(parts) - node.level + 1], node.module])
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {module: imports_of(module) for module in MODULES}


def reaches(start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def test_no_module_under_admission_is_over_500_lines() -> None:
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in MODULES.items()}
    assert {m: n for m, n in sizes.items() if n > 500} == {}


def test_the_reservation_module_never_imports_the_limiter() -> None:
    # Statically: at run time the package's __init__ loads both anyway.
    assert "rateloop.admission.limiter" not in GRAPH["rateloop.admission.reservation"]
    assert not reaches("rateloop.admission.reservation", "rateloop.admission.limiter")


@pytest.mark.parametrize(
    "collaborator",
    ["runner", "known", "admit", "feedback", "reservation", "plan", "learning"],
)
def test_the_limiters_collaborators_never_import_it(collaborator: str) -> None:
    assert not reaches(f"rateloop.admission.{collaborator}", "rateloop.admission.limiter")


def test_the_collaborators_depend_one_way() -> None:
    assert not reaches("rateloop.admission.runner", "rateloop.admission.known")
    assert not reaches("rateloop.admission.known", "rateloop.admission.runner")
    assert not reaches("rateloop.admission.known", "rateloop.admission.admit")
    assert not reaches("rateloop.admission.known", "rateloop.admission.feedback")
    assert not reaches("rateloop.admission.admit", "rateloop.admission.feedback")
    assert not reaches("rateloop.admission.feedback", "rateloop.admission.admit")


def test_admission_has_no_import_cycle() -> None:
    cyclic = sorted(m for m in GRAPH if reaches(m, m))
    assert cyclic == []


@pytest.mark.parametrize("leaf", ["protocol", "registry", "keys"])
def test_the_backend_protocol_and_registry_are_leaves(leaf: str) -> None:
    allowed = {"rateloop.admission.backends.protocol"}
    assert imports_of(f"rateloop.admission.backends.{leaf}") <= allowed


def test_importing_rateloop_loads_no_redis_client() -> None:
    code = (
        "import sys, rateloop, rateloop.admission.backends; "
        "print('redis' in sys.modules, 'rateloop.admission.backends.clients' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    "old",
    [
        "rateloop.admission.memory",
        "rateloop.admission.backend",
        "rateloop.admission.redis_backend",
        "rateloop.admission._redis_wire",
        "rateloop.admission._admit_script",
        "rateloop.admission._driver",
        "rateloop.admission._known",
    ],
)
def test_no_shim_is_left_at_an_old_path(old: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_the_lua_scripts_ship_with_the_backends_package() -> None:
    package = resources.files("rateloop.admission.backends")
    names = {"_common", "admit", "settle", "pause", "observe", "learned"}
    assert all(package.joinpath(f"{name}.lua").is_file() for name in names)
    for name in ("pause", "observe", "learned"):
        assert script_text(name).startswith(package.joinpath("_common.lua").read_text())


def test_observe_reads_the_key_layout_from_its_one_owner() -> None:
    assert redis_state.key_of is keys.key_of
    assert redis_state.scope_of_key is keys.scope_of_key
    assert redis_state.KINDS is keys.KINDS
    source = Path(redis_state.__file__).read_text(encoding="utf-8")
    assert "def key_of" not in source and "def scope_of_key" not in source


def test_without_redis_py_a_redis_url_says_which_extra_to_install() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from rateloop.admission import Limiter\n"
        "try:\n"
        "    Limiter.from_url('redis://127.0.0.1:1/0')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'rateloop[redis]'" in out.stdout
