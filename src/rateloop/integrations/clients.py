"""Ready SDK clients: the SDK's own client, its retries off, the RATE-loop transport inside.

Each helper takes the SDK's usual keyword arguments plus ``policy=``,
``limiter=`` and ``loop=`` (and ``clock=`` for tests); the user's program
stays the SDK's, with one changed constructor line::

    client = rateloop.openai_client()          # was: openai.OpenAI()

Which HTTP client each SDK takes (checked on the installed versions):
``openai`` 3.x and ``anthropic`` 2.x build on ``httpx2`` (they accept a legacy
``httpx`` client too); ``google-genai`` takes either in
``HttpOptions(httpx_client=..., httpx_async_client=...)``.  The helpers give
each SDK an ``httpx2`` client when ``httpx2`` is installed, else ``httpx``.

Without ``limiter=`` (or ``loop=``) each client gets its own limiter from the
policy (``[admission]``: in memory by default): it learns the provider's
limits from the ``x-ratelimit-*`` / ``anthropic-ratelimit-*`` headers of
every response and paces the calls to them.  Pass one shared
``Limiter.from_url("redis://...")`` to share capacity across processes.

The SDK's own retries are off (``max_retries=0``; google-genai retries only
when given ``retry_options``): stacked retries multiply, and the loop owns
them.  Passing ``max_retries`` or an ``http_client`` yourself is refused with
the reason, since either would silently take 429 recovery away from the loop.
The openai and anthropic clients stay so when copied
(:mod:`~rateloop.integrations._ready`): ``client.with_options(max_retries=3)``
keeps the SDK's retries off and warns, ``with_options(http_client=...)`` is
refused, and rateloop's own errors (``BackendUnreachable``,
``AdmissionRefused``) reach the caller as themselves through every SDK.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from rateloop.integrations._assemble import SDK_RETRIES, need, take_loop_options
from rateloop.integrations._ready import ready_class
from rateloop.loop.drivers import AsyncRateLoop, RateLoop
from rateloop.policy import Policy

__all__ = [
    "anthropic_client",
    "async_anthropic_client",
    "async_openai_client",
    "genai_client",
    "openai_client",
    "rateloop_transport",
]


# The connection pool the OpenAI and Anthropic SDKs give their default client.
_POOL = {"max_connections": 1000, "max_keepalive_connections": 100}


def _faces(package: str) -> ModuleType:
    """The rateloop transport module for ``package``; ImportError when it is not installed."""
    if package == "httpx2":
        from rateloop.integrations import httpx2

        return httpx2
    if package == "httpx":
        from rateloop.integrations import httpx

        return httpx
    raise ValueError(f"package must be 'httpx2' or 'httpx', got {package!r}")


def _http_module(prefer: str | None = None) -> tuple[Any, Any]:
    """(the httpx-like module, its rateloop transport module): ``prefer``, else httpx2 first."""
    order = [prefer] if prefer else ["httpx2", "httpx"]
    for name in order:
        try:
            faces = _faces(name)
        except ImportError:
            continue
        return faces.RateLoopTransport.hx, faces
    raise ImportError("the ready clients need httpx2 or httpx: pip install 'rateloop[httpx2]'")


def _sdk_http(sdk: Any, is_async: bool) -> tuple[Any, str | None]:
    """The SDK's default HTTP client class and the package it builds on (httpx2 or httpx)."""
    factory = getattr(sdk, "DefaultAsyncHttpxClient" if is_async else "DefaultHttpxClient", None)
    if factory is None:
        return None, None
    for base in factory.__mro__:
        package = base.__module__.split(".", 1)[0]
        if package in ("httpx", "httpx2"):
            return factory, package
    return None, None


def rateloop_transport(
    *,
    is_async: bool,
    package: str | None = None,
    policy: Policy | None = None,
    limiter: Any = None,
    loop: RateLoop | AsyncRateLoop | None = None,
    **options: Any,
) -> Any:
    """A RATE-loop transport over a pooled inner transport (the SDKs' default pool).

    The transport assembles its loop through
    :func:`~rateloop.integrations._assemble.admission`, so without ``limiter`` /
    ``loop`` it gets the self-learning limiter.
    """
    hx, faces = _http_module(package)
    limits = hx.Limits(**_POOL)
    if is_async:
        return faces.AsyncRateLoopTransport(
            hx.AsyncHTTPTransport(limits=limits), policy=policy, limiter=limiter, loop=loop,
            **options,
        )
    return faces.RateLoopTransport(
        hx.HTTPTransport(limits=limits), policy=policy, limiter=limiter, loop=loop, **options
    )


def _ready_sdk_client(module: str, cls: str, *, is_async: bool, kwargs: dict[str, Any]) -> Any:
    """``module.cls(**kwargs)`` with its retries off and the RATE-loop transport inside."""
    ours = take_loop_options(kwargs)
    sdk = need(module, module)
    factory, package = _sdk_http(sdk, is_async)
    hx, _ = _http_module(package)
    inner = rateloop_transport(is_async=is_async, package=hx.__name__, **ours)
    if factory is None:
        factory = hx.AsyncClient if is_async else hx.Client
    http_client = factory(transport=inner)
    # The SDK's class, kept so: a copy keeps its retries off, and rateloop's errors pass.
    ready = ready_class(getattr(sdk, cls), sdk.APIConnectionError)
    return ready(max_retries=SDK_RETRIES, http_client=http_client, **kwargs)


def openai_client(**kwargs: Any) -> Any:
    """``openai.OpenAI(**kwargs)`` with its retries off and the RATE loop inside."""
    return _ready_sdk_client("openai", "OpenAI", is_async=False, kwargs=kwargs)


def async_openai_client(**kwargs: Any) -> Any:
    """``openai.AsyncOpenAI(**kwargs)`` with its retries off and the async RATE loop inside."""
    return _ready_sdk_client("openai", "AsyncOpenAI", is_async=True, kwargs=kwargs)


def anthropic_client(**kwargs: Any) -> Any:
    """``anthropic.Anthropic(**kwargs)`` with its retries off and the RATE loop inside."""
    return _ready_sdk_client("anthropic", "Anthropic", is_async=False, kwargs=kwargs)


def async_anthropic_client(**kwargs: Any) -> Any:
    """``anthropic.AsyncAnthropic(**kwargs)`` with retries off and the async RATE loop inside."""
    return _ready_sdk_client("anthropic", "AsyncAnthropic", is_async=True, kwargs=kwargs)


def genai_client(**kwargs: Any) -> Any:
    """``google.genai.Client(**kwargs)`` with both its sync and async paths through the loop.

    ``http_options`` (a ``HttpOptions`` or a dict) keeps everything you set but
    the HTTP clients; ``retry_options`` in it is refused (it would retry on
    top of the loop).
    """
    ours = take_loop_options(kwargs)
    genai = need("google.genai", "google")
    types = need("google.genai.types", "google")
    hx, _ = _http_module()
    options = kwargs.pop("http_options", None)
    if options is None:
        options = types.HttpOptions()
    elif isinstance(options, dict):
        options = types.HttpOptions(**options)
    if options.retry_options is not None:
        raise TypeError(
            "http_options.retry_options would retry on top of the RATE loop; leave it unset"
        )
    if options.httpx_client is not None or options.httpx_async_client is not None:
        raise TypeError("http_options.httpx_client/httpx_async_client are set by genai_client")
    # A loop given by the caller has one flavour; each path gets a performer of its own.
    package = hx.__name__
    options = options.model_copy(
        update={
            "httpx_client": hx.Client(
                transport=rateloop_transport(is_async=False, package=package, **ours)
            ),
            "httpx_async_client": hx.AsyncClient(
                transport=rateloop_transport(is_async=True, package=package, **ours)
            ),
        }
    )
    return genai.Client(http_options=options, **kwargs)
