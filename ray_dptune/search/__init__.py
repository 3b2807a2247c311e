"""Ray Tune searchers whose whole search is differentially private.

The searchers load lazily, so the Ray-free parts of this package (the projection onto
bounded densities) can be imported without Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BoundedDensitySampler": "ray_dptune.search.density",
    "ConstantOverheadSearcher": "ray_dptune.search.constant_overhead",
    "DPBOSearcher": "ray_dptune.search.dpbo",
    "DPHyPOSearcher": "ray_dptune.search.dphypo",
    "RandomCountSearcher": "ray_dptune.search.random_count",
}

__all__ = [
    "BoundedDensitySampler",
    "ConstantOverheadSearcher",
    "DPBOSearcher",
    "DPHyPOSearcher",
    "RandomCountSearcher",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ray_dptune.search' has no attribute {name!r}")
