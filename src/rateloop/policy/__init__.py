"""Policy: everything configurable about retries, backoff, budgets, fallback and admission.

Loaded from TOML, YAML, ``pyproject.toml`` ``[tool.rateloop]`` or the
environment, stacked in layers (defaults < organisation < repository < env)
with locks an earlier layer can place on a later one, and validated at load:
a bad value fails loading with a :class:`~rateloop.errors.ConfigError` that
names the file, the key, the value and what is allowed.  It never quietly
changes a bound.  The keys, defaults and bounds are listed in
``docs/policy.md``.

>>> policy = Policy.from_dict({"max_attempts": 5, "backoff": {"max_delay_secs": 30}})
>>> policy.max_attempts, policy.max_delay_secs, policy.provenance["backoff.max_delay_secs"]
(5, 30.0, 'code')
"""

from rateloop.policy._build import PolicyWarning
from rateloop.policy._layers import ENV_IGNORED, Layer
from rateloop.policy._model import (
    AdmissionPolicy,
    AgentsPolicy,
    FallbackPolicy,
    Governance,
    LadderPolicy,
    Policy,
)

__all__ = [
    "ENV_IGNORED",
    "AdmissionPolicy",
    "AgentsPolicy",
    "FallbackPolicy",
    "Governance",
    "LadderPolicy",
    "Layer",
    "Policy",
    "PolicyWarning",
]
