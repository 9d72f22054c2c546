"""Provider accounting profiles: how each provider charges, refunds and paces its limits.

How it works.  A reservation holds an estimate -- the input tokens and the
``max_tokens`` of the output.  What the provider does with that estimate
differs, and admission must do the same or it over-admits (refunding what the
provider keeps) or under-admits (keeping what the provider gives back):

1. **Output** (``output``): ``"kept"`` -- the provider counts ``max_tokens``
   when the request arrives and does not give the unused part back (OpenAI);
   ``"corrected"`` -- it counts ``max_tokens`` first and corrects to the
   tokens really produced when the response ends (Anthropic, Bedrock, Azure).
2. **Total tokens** (``tokens_include_output``): whether a
   ``tokens_per_minute`` limit counts output at all (Gemini's TPM counts
   input only).
3. **Cache reads** (``cache_reads_count``): whether input served from the
   prompt cache counts toward input limits (Anthropic: no; Bedrock: reserved,
   then released when the response ends).
4. **Failed requests** (``failed_requests_count``): a refused or failed call
   still spends its request (OpenAI documents it); its tokens go back.
5. **Quantisation** (``quantum_secs``): a per-minute limit is enforced over
   shorter intervals (OpenAI: "60 RPM may be enforced as 1 request per
   second"), so by default a bucket holds ``quantum_secs`` of its rate, not a
   minute's allowance (see :func:`default_burst`).

The profile of a scope is the ``profile`` of its :class:`LimitSpec`, else the
one named after the route's provider (:func:`profile_for`), else ``generic``.
The public source of every rule is in ``docs/admission.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "INPUT_FIELDS",
    "OUTPUT_FIELDS",
    "PROFILES",
    "AccountingProfile",
    "default_burst",
    "profile_for",
    "reports_tokens",
    "usage_charge",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountingProfile:
    """How one provider counts a call against its limits (see the module docstring)."""

    name: str
    output: Literal["kept", "corrected"]
    tokens_include_output: bool = True
    cache_reads_count: bool = True
    failed_requests_count: bool = True
    quantum_secs: float = 1.0

    def __repr__(self) -> str:
        return f"AccountingProfile({self.name!r})"

    def settle_deltas(
        self, reserved: tuple[int, int], used: tuple[int, int]
    ) -> tuple[int, int, int]:
        """(input, output, total) tokens to add to the buckets when a call settles.

        ``reserved`` is the estimate held, ``used`` the usage as the provider
        charges it (:func:`usage_charge`).  Input is always corrected to the
        usage; output is corrected, or kept when the provider keeps
        ``max_tokens`` (only an excess over the estimate is charged).  The
        total follows whatever the total-tokens limit counts.
        """
        d_in = used[0] - reserved[0]
        d_out = used[1] - reserved[1]
        if self.output == "kept" and d_out < 0:
            d_out = 0
        d_total = d_in + d_out if self.tokens_include_output else d_in
        return d_in, d_out, d_total


PROFILES: Mapping[str, AccountingProfile] = {
    p.name: p
    for p in (
        AccountingProfile(name="openai", output="kept"),
        AccountingProfile(name="azure", output="corrected"),
        AccountingProfile(name="anthropic", output="corrected", cache_reads_count=False),
        AccountingProfile(name="gemini", output="corrected", tokens_include_output=False),
        AccountingProfile(name="bedrock", output="corrected", cache_reads_count=False),
        AccountingProfile(name="generic", output="corrected"),
    )
}

#: Route providers that name a profile other than their own.
_ALIASES = {
    "azure_openai": "azure",
    "azure-openai": "azure",
    "azureopenai": "azure",
    "claude": "anthropic",
    "google": "gemini",
    "vertex": "gemini",
    "vertex_ai": "gemini",
    "aws": "bedrock",
    "aws-bedrock": "bedrock",
}


def profile_for(provider: str, name: str | None = None) -> AccountingProfile:
    """The profile named ``name`` (a policy's override), else the provider's own, else generic.

    >>> profile_for("openai").output, profile_for("mistral").name, profile_for("x", "gemini").name
    ('kept', 'generic', 'gemini')
    """
    if name is not None:
        try:
            return PROFILES[name]
        except KeyError:
            allowed = ", ".join(PROFILES)
            raise ValueError(f"unknown accounting profile {name!r} (allowed: {allowed})") from None
    key = provider.lower()
    return PROFILES.get(_ALIASES.get(key, key)) or PROFILES["generic"]


def default_burst(profile: AccountingProfile) -> float:
    """The fraction of a minute's allowance a bucket holds when ``burst`` is not set."""
    return profile.quantum_secs / 60.0


#: Where a usage reports its input and output tokens: OpenAI, Anthropic, google-genai's
#: attributes and Gemini's REST (camelCase), Bedrock.
INPUT_FIELDS = ("input_tokens", "prompt_tokens", "prompt_token_count", "promptTokenCount",
                "inputTokens")
OUTPUT_FIELDS = ("output_tokens", "completion_tokens", "candidates_token_count",
                 "candidatesTokenCount", "outputTokens")


def _count(usage: Any, *names: str) -> int | None:
    """The first of ``names`` that ``usage`` (an object or its JSON) holds as an integer."""
    for name in names:
        value = usage.get(name) if isinstance(usage, Mapping) else getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _field(usage: Any, *names: str) -> int:
    count = _count(usage, *names)
    return 0 if count is None else count


def reports_tokens(usage: Any) -> bool:
    """Whether ``usage`` carries at least one input or output token count."""
    return _count(usage, *INPUT_FIELDS, *OUTPUT_FIELDS) is not None


def _nested(usage: Any, outer: str, inner: str) -> int:
    part = usage.get(outer) if isinstance(usage, Mapping) else getattr(usage, outer, None)
    return _field(part, inner) if part is not None else 0


def usage_charge(profile: AccountingProfile, usage: Any) -> tuple[int, int]:
    """(input, output) tokens of a provider's ``usage`` as ``profile`` charges them.

    ``usage`` is the SDK's usage object or its JSON (``prompt_tokens`` /
    ``completion_tokens``, ``input_tokens`` / ``output_tokens``,
    ``promptTokenCount`` / ``candidatesTokenCount``, Bedrock's
    ``inputTokens`` / ``outputTokens``).  Cache reads are left out where the
    provider does not count them: Anthropic reports them apart from
    ``input_tokens`` already; Bedrock's ``inputTokens`` excludes them and its
    cache writes count.

    >>> usage_charge(PROFILES["anthropic"], {"input_tokens": 20, "output_tokens": 5,
    ...     "cache_read_input_tokens": 900, "cache_creation_input_tokens": 100})
    (120, 5)
    >>> usage_charge(PROFILES["openai"], {"prompt_tokens": 900, "completion_tokens": 7,
    ...     "prompt_tokens_details": {"cached_tokens": 800}})
    (900, 7)
    """
    output = _field(usage, *OUTPUT_FIELDS)
    inp = _field(usage, *INPUT_FIELDS)
    writes = _field(usage, "cache_creation_input_tokens", "cacheWriteInputTokens")
    reads = _field(usage, "cache_read_input_tokens", "cacheReadInputTokens")
    # Anthropic and Bedrock report cache reads and writes next to an input count that
    # excludes both; OpenAI and Gemini fold cached tokens into their prompt count.
    inp += writes
    if profile.cache_reads_count:
        inp += reads
    elif reads == 0:
        inp -= _nested(usage, "prompt_tokens_details", "cached_tokens") + _field(
            usage, "cached_content_token_count", "cachedContentTokenCount"
        )
    return max(inp, 0), output
