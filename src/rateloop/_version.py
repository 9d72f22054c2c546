"""The installed version of rateloop, read from its metadata on first use."""

from __future__ import annotations

from functools import cache

__all__ = ["package_version"]


@cache
def package_version() -> str:
    """``rateloop``'s version (``0.0.0+unknown`` when running from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rateloop")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0.0.0+unknown"
