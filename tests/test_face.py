"""`import rateloop` loads the core only; every other public name loads on first use.

Each check runs in a fresh interpreter: this test process has imported
everything already (the pytest plugin alone loads the fake provider).  No
timing here: ``bench/import_time.py`` measures; these tests hold what loads.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import rateloop

#: Not loaded by `import rateloop`: the event loop, the task store's driver,
#: process spawning, the HTTP clients and the CLI's libraries, configuration
#: parsers, the network stack, package metadata.
NOT_LOADED = (
    "asyncio",
    "email",
    "httpx",
    "httpx2",
    "importlib.metadata",
    "redis",
    "rich",
    "socket",
    "sqlite3",
    "ssl",
    "subprocess",
    "tomllib",
    "typer",
    "yaml",
    "zoneinfo",
)

#: Loaded only when a name of theirs is first used: Read, every stage above
#: Time, the durable tasks and every edge.
LAZY_PACKAGES = (
    "rateloop.admission",
    "rateloop.agents",
    "rateloop.classify",
    "rateloop.cli",
    "rateloop.integrations",
    "rateloop.loop",
    "rateloop.observe",
    "rateloop.policy",
    "rateloop.sim",
    "rateloop.tasks",
    "rateloop.testing",
)

#: The core today is 21 modules (the face, the vocabulary, Exit's record and
#: Time); a little room, not a lot.
MAX_RATELOOP_MODULES = 24


def _fresh(code: str) -> object:
    """Run ``code`` in a new interpreter; it prints one JSON value."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


def test_import_rateloop_loads_the_core_only() -> None:
    loaded = _fresh(
        "import sys, json; before = set(sys.modules); import rateloop; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    assert isinstance(loaded, list)
    heavy = [m for m in loaded if m in NOT_LOADED or m.split(".")[0] in NOT_LOADED]
    assert heavy == []
    edges = [m for m in loaded if any(m == p or m.startswith(p + ".") for p in LAZY_PACKAGES)]
    assert edges == []
    ours = [m for m in loaded if m == "rateloop" or m.startswith("rateloop.")]
    assert len(ours) <= MAX_RATELOOP_MODULES, ours


def test_every_public_name_is_eager_or_lazy_and_listed() -> None:
    eager = {name for name in rateloop.__all__ if name in vars(rateloop)} - set(rateloop._LAZY)
    assert set(rateloop._LAZY) <= set(rateloop.__all__)
    assert set(rateloop.__all__) == eager | set(rateloop._LAZY) | {"__version__"}
    assert set(rateloop.__all__) <= set(dir(rateloop))


def test_lazy_names_wait_for_their_first_use() -> None:
    state = _fresh(
        "import json, rateloop; "
        "before = sorted(n for n in rateloop._LAZY if n in vars(rateloop)); "
        "from rateloop import RateLoop; "
        "print(json.dumps([before, 'RateLoop' in vars(rateloop)]))"
    )
    assert state == [[], True]


@pytest.mark.parametrize("name", sorted(rateloop._LAZY))
def test_each_lazy_name_imports_alone(name: str) -> None:
    # `from rateloop import X` as the first thing a program does; the object is
    # the one its module defines (looked up in sys.modules: `import
    # rateloop.classify as m` gives the function, as it always has).
    module = rateloop._LAZY[name]
    same = _fresh(
        f"import importlib, json; from rateloop import {name}; "
        f"m = importlib.import_module({module!r}); "
        f"print(json.dumps({name} is getattr(m, {name!r})))"
    )
    assert same is True


def test_loading_every_edge_keeps_the_classify_function() -> None:
    # `rateloop.classify` names a subpackage and a function: the face binds the
    # function, and importing the stages (which import the subpackage) or the
    # subpackage's own modules must not put the module in its place.
    names = _fresh(
        "import json, rateloop; from rateloop.classify import text; "
        "import rateloop.classify._core; "
        "from rateloop import RateLoop, task, run_step, openai_client, Policy; "
        "print(json.dumps([type(rateloop.classify).__name__, "
        "callable(getattr(rateloop, 'classify_text'))]))"
    )
    assert names == ["function", True]


def test_importing_the_read_subpackage_first_keeps_the_classify_function() -> None:
    names = _fresh(
        "import json, rateloop.classify; import rateloop; "
        "print(json.dumps([type(rateloop.classify).__name__, "
        "rateloop.classify is rateloop.classify_response.__globals__['classify']]))"
    )
    assert names == ["function", True]


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        rateloop.Nope  # noqa: B018
    with pytest.raises(ImportError):
        exec("from rateloop import Nope", {})


def test_version_is_the_installed_metadata() -> None:
    from importlib.metadata import version

    assert rateloop.__version__ == version("rateloop")
