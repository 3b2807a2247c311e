"""Privacy accounting for whole hyperparameter searches: pure math, no Ray, no torch.

>>> from ray_dptune.accounting import RDPCurve, repeat_and_select
>>> from ray_dptune.accounting.bounds.distributions import Poisson
>>> base = RDPCurve.gaussian(noise_multiplier=5 ** 0.5)              # 0.1-zCDP
>>> search = repeat_and_select(base, Poisson(mean=10))
>>> search.epsilon(delta=1e-6) < (10 * base).epsilon(delta=1e-6)
True
"""

from ray_dptune.accounting.bounds.lemma7.generic import generic_repeat_and_select
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.accounting.curves.profiles import gaussian_profile, subsampled_gaussian_profile
from ray_dptune.accounting.curves.rdp import DEFAULT_ORDERS, RDPCurve

__all__ = [
    "DEFAULT_ORDERS",
    "RDPCurve",
    "gaussian_profile",
    "generic_repeat_and_select",
    "repeat_and_select",
    "subsampled_gaussian_profile",
]
