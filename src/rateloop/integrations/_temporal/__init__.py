"""The private parts of :mod:`rateloop.integrations.temporal` (import that module, not these)."""
