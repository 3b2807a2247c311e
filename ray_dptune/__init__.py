"""ray_dptune: differentially private hyperparameter search for Ray Tune.

One honest (ε, δ) for a whole search: a random number of DP trials (Papernot &
Steinke 2022), adaptive bounded-density sampling (DP-HyPO), and a callback that
composes what every trial spent.
"""

from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.distributions import Geometric, Logarithmic, PointMass, Poisson, TruncatedNegativeBinomial
from ray_dptune.errors import PrivacyError, UnsupportedBoundError

__version__ = "0.1.0"

__all__ = [
    "Geometric",
    "Logarithmic",
    "PointMass",
    "Poisson",
    "PrivacyError",
    "RDPCurve",
    "TruncatedNegativeBinomial",
    "UnsupportedBoundError",
    "repeat_and_select",
]
