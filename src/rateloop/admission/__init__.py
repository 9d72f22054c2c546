"""Admit: reserve shared capacity before a call."""

from rateloop.admission.spec import LimitSpec

__all__ = ["LimitSpec"]
