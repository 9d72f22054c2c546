"""What a reader of agent text returns: one recognized message (a leaf shared by the readers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo

from rateloop.signal import Dimension, Kind

__all__ = ["Reader", "Reading"]


@dataclass(frozen=True, slots=True)
class Reading:
    """One recognized message: its kind and evidence; ``wait`` is unclamped seconds.

    ``code`` names the allowance the text said ran out
    (:mod:`rateloop.classify._allowance`), or ``None`` when it does not say.
    """

    kind: Kind
    matched: str
    provider: str | None = None
    wait: float | None = None
    reset_at: datetime | None = None
    dimension: Dimension | None = None
    soft_period: bool = False
    code: str | None = None


Reader = Callable[[str, datetime, "tzinfo | None"], "Reading | None"]
