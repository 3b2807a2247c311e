"""Ray Tune searchers whose whole search is differentially private.

The searchers load lazily, so the Ray-free parts of this package (the projection onto
bounded densities) can be imported without Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

from ray_dptune.search.registry import SEARCHERS

_LAZY = {**SEARCHERS, "BoundedDensitySampler": "ray_dptune.search.density"}

__all__ = [  # the registry's names (tests/search/test_searcher_contract.py checks), written out for static readers
    "BoundedDensitySampler",
    "ConstantOverheadSearcher",
    "DPBOSearcher",
    "DPHyPOSearcher",
    "HalvingSearcher",
    "RandomCountSearcher",
    "SubsampledTuningSearcher",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ray_dptune.search' has no attribute {name!r}")
