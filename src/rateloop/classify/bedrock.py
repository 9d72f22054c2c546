"""AWS Bedrock: the error type is in ``x-amzn-errortype`` or the body's ``__type``.

The header value looks like
``ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/``
and ``__type`` may be namespaced (``com.amazon.coral.service#ThrottlingException``);
both are cut down to the bare name.  ThrottlingException is a throttle ("Too
many tokens" / "Too many requests"; "… per day" is a spent period),
ServiceQuotaExceededException a spent period, ModelNotReadyException and
ServiceUnavailableException overload.
"""

from __future__ import annotations

from collections.abc import Mapping

from rateloop.classify._evidence import Evidence, Finding
from rateloop.classify._rules import message_of, throttle
from rateloop.signal import Kind

__all__ = ["error_type", "rule"]

_KINDS: dict[str, Kind] = {
    "ServiceQuotaExceededException": Kind.PERIOD_QUOTA,
    "ModelNotReadyException": Kind.OVERLOAD,
    "ServiceUnavailableException": Kind.OVERLOAD,
    "ModelTimeoutException": Kind.SERVER_ERROR,
    "ModelErrorException": Kind.SERVER_ERROR,
    "ModelStreamErrorException": Kind.SERVER_ERROR,
    "InternalServerException": Kind.SERVER_ERROR,
    "InternalFailure": Kind.SERVER_ERROR,
    "ValidationException": Kind.INVALID,
    "ResourceNotFoundException": Kind.INVALID,
    "ConflictException": Kind.INVALID,
    "AccessDeniedException": Kind.PERMISSION,
    "UnrecognizedClientException": Kind.PERMISSION,
    "ExpiredTokenException": Kind.PERMISSION,
    "InvalidSignatureException": Kind.PERMISSION,
}
_THROTTLES = frozenset({"ThrottlingException", "TooManyRequestsException", "Throttling"})


def error_type(ev: Evidence) -> str | None:
    """The bare AWS error type name, from the header or the body."""
    raw = ev.header("x-amzn-errortype")
    if not raw and isinstance(ev.data, Mapping):
        value = ev.data.get("__type") or ev.data.get("code")
        raw = value if isinstance(value, str) else None
    if not raw:
        return None
    name = raw.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    return name or None


def rule(ev: Evidence) -> Finding | None:
    name = error_type(ev)
    if name is None or (name not in _KINDS and name not in _THROTTLES):
        return None
    request_id = ev.header("x-amzn-requestid")
    if name in _THROTTLES:
        found = throttle(ev, message=message_of(ev), code=name, matched=name)
        return Finding(
            kind=found.kind,
            code=name,
            matched=name if found.kind is Kind.TEMPORARY else found.matched,
            dimension=found.dimension,
            retry_after=found.retry_after,
            request_id=request_id,
        )
    return Finding(kind=_KINDS[name], code=name, matched=name, request_id=request_id)
