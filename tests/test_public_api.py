from __future__ import annotations

import subprocess
import sys

import rateloop
from rateloop import Kind, LimitSignal


def test_all_is_sorted_and_exported() -> None:
    assert list(rateloop.__all__) == sorted(rateloop.__all__)
    for name in rateloop.__all__:
        assert hasattr(rateloop, name), name


def test_signal_is_frozen_and_readable() -> None:
    sig = LimitSignal.of(Kind.TEMPORARY, retry_after=1e300, status=429, provider="openai")
    assert sig.retryable
    assert sig.retry_after == 86_400.0
    text = repr(sig)
    assert text.startswith("LimitSignal(temporary, retryable, status=429")
    assert "provider='openai'" in text
    try:
        sig.kind = Kind.OK  # type: ignore[misc]
    except AttributeError:
        pass
    else:  # pragma: no cover
        raise AssertionError("LimitSignal must be frozen")


def test_version_from_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rateloop", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"rateloop {rateloop.__version__}"
