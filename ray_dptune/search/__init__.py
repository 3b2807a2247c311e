"""Ray Tune searchers whose whole search is differentially private."""

from ray_dptune.search.constant_overhead import ConstantOverheadSearcher
from ray_dptune.search.dpbo import DPBOSearcher
from ray_dptune.search.dphypo import BoundedDensitySampler, DPHyPOSearcher
from ray_dptune.search.random_count import RandomCountSearcher

__all__ = ["BoundedDensitySampler", "ConstantOverheadSearcher", "DPBOSearcher", "DPHyPOSearcher", "RandomCountSearcher"]
