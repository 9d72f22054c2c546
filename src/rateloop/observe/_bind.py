"""Where an observability server may listen: loopback unless explicitly allowed."""

from __future__ import annotations

import ipaddress

__all__ = ["check_bind"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, allow_remote: bool) -> None:
    """Refuse a non-loopback ``host`` unless ``allow_remote``; these servers have no auth.

    >>> check_bind("127.0.0.1", allow_remote=False)
    >>> check_bind("0.0.0.0", allow_remote=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: refusing to listen on '0.0.0.0': not a loopback address; ...
    """
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be an address such as '127.0.0.1', got {host!r}")
    if not is_loopback(host) and not allow_remote:
        raise ValueError(
            f"refusing to listen on {host!r}: not a loopback address; the page and metrics "
            "have no authentication. Allowed: 127.0.0.1, ::1, localhost, or pass "
            "--allow-remote (allow_remote=True) to listen on another address on purpose"
        )
