"""DP-SGD trials for Ray Tune: ``dp_trainable`` and a ready-made digits example.

>>> from ray_dptune.training import digits_cnn, digits_data, dp_trainable
>>> trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=2.5, batch_size=64, epochs=15)
>>> plan = trainable.privacy_plan({"lr": 0.5, "max_grad_norm": 1.0})
>>> plan.steps, round(plan.sample_rate, 4)
(330, 0.0445)

Importing this package imports torch and Opacus, but not Ray (only a running trial and
:meth:`DPTrainable.privacy_plan` do); without them it raises an ImportError naming
``pip install 'ray_dptune[train]'``.
"""

from ray_dptune.extras import extra_imports

with extra_imports("train", __name__):
    import opacus  # noqa: F401  (every module below needs torch and Opacus: one message for them all)
    import torch  # noqa: F401

from ray_dptune.accounting.bookkeeping.spend import sampling_schedule
from ray_dptune.result_keys import PARTITION_KEY
from ray_dptune.training.automatic import AutomaticClipDPOptimizer, automatic_clipping
from ray_dptune.training.canaries import CanaryAudit, CanaryScorer
from ray_dptune.training.clipping import ClippingMode
from ray_dptune.training.data import digits_data
from ray_dptune.training.loop import Report, train, train_step
from ray_dptune.training.models import digits_cnn
from ray_dptune.training.opacus_spend import OpacusPlan, OpacusSpend, opacus_plan, tuning_loader
from ray_dptune.training.oso import OSODPOptimizer
from ray_dptune.training.partition import Partition
from ray_dptune.training.plan import PRIVACY_KEYS, PrivacyParams, space_plan, trial_plan
from ray_dptune.training.quantile import QuantileClipDPOptimizer
from ray_dptune.training.spec import DEFAULT_GRAD_SAMPLE_MODE, GradSampleMode, Hyperparameters, OptimizerName, TrainSpec
from ray_dptune.training.state import SpendGuard, TrainState
from ray_dptune.training.trainable import DPTrainable, dp_trainable
from ray_dptune.tuning_sample import TuningSample, tuning_sample_indices

__all__ = [
    "DEFAULT_GRAD_SAMPLE_MODE",
    "PARTITION_KEY",
    "PRIVACY_KEYS",
    "AutomaticClipDPOptimizer",
    "CanaryAudit",
    "CanaryScorer",
    "ClippingMode",
    "DPTrainable",
    "GradSampleMode",
    "Hyperparameters",
    "OSODPOptimizer",
    "OpacusPlan",
    "OpacusSpend",
    "OptimizerName",
    "Partition",
    "PrivacyParams",
    "QuantileClipDPOptimizer",
    "Report",
    "SpendGuard",
    "TrainSpec",
    "TrainState",
    "TuningSample",
    "automatic_clipping",
    "digits_cnn",
    "digits_data",
    "dp_trainable",
    "opacus_plan",
    "sampling_schedule",
    "space_plan",
    "train",
    "train_step",
    "trial_plan",
    "tuning_loader",
    "tuning_sample_indices",
]
