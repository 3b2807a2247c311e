"""ray_dptune: differentially private hyperparameter search for Ray Tune.

One honest (ε, δ) for a whole search: a random number of DP trials (Papernot &
Steinke 2022), adaptive bounded-density sampling (DP-HyPO), and a callback that
composes what every trial spent. The Ray-facing names load lazily, so the
accounting can be used without importing Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.accounting.bookkeeping.calibrate import calibrate_noise_multiplier
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    TruncatedNegativeBinomial,
)
from ray_dptune.errors import BudgetExceededError, PrivacyError, RefusedBeforeTraining, UnsupportedBoundError
from ray_dptune.search.registry import SEARCHERS

__version__ = "0.1.0"

_LAZY = {
    **SEARCHERS,
    "PrivacyAccountantCallback": "ray_dptune.tune.accountant",
    "PrivacyGuardScheduler": "ray_dptune.tune.guard",
    "PrivacyLedger": "ray_dptune.records.ledger",
    "PrivateASHAScheduler": "ray_dptune.tune.private_asha",
    "check_scheduler": "ray_dptune.tune.guard",
    "private_tune_config": "ray_dptune.tune.guard",
    "ReleasedTrial": "ray_dptune.tune.release",
    "release_best": "ray_dptune.tune.release",
    "dp_trainable": "ray_dptune.training",
    "CanaryAudit": "ray_dptune.training",
    "private_tuner": "ray_dptune.tune.tuner",
}

__all__ = [  # the searchers are the registry's (tests/search/test_searcher_contract.py checks)
    "BudgetExceededError",
    "CanaryAudit",
    "ConstantOverheadSearcher",
    "DPBOSearcher",
    "DPHyPOSearcher",
    "Geometric",
    "HalvingSearcher",
    "Logarithmic",
    "PointMass",
    "Poisson",
    "PrivacyAccountantCallback",
    "PrivacyError",
    "PrivacyGuardScheduler",
    "PrivacyLedger",
    "PrivateASHAScheduler",
    "RDPCurve",
    "RandomCountSearcher",
    "RefusedBeforeTraining",
    "ReleasedTrial",
    "SubsampledTuningSearcher",
    "TrialSpend",
    "TruncatedNegativeBinomial",
    "UnsupportedBoundError",
    "calibrate_noise_multiplier",
    "check_scheduler",
    "dp_trainable",
    "private_tune_config",
    "private_tuner",
    "release_best",
    "repeat_and_select",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ray_dptune' has no attribute {name!r}")
