"""What a DP-SGD trial is made of besides its config: :class:`TrainSpec`, and the options it takes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from numbers import Real
from typing import Any, Literal, cast, get_args

import torch
from torch import nn
from torch.utils.data import Dataset

from ray_dptune.result_keys import AUDIT_KEY, PLAN_KEY, PRIVATE_KEY, SPENT_KEY
from ray_dptune.training.automatic import AUTOMATIC_CLIPPING_NORM
from ray_dptune.training.canaries import CanaryAudit
from ray_dptune.training.plan import PrivacyParams

__all__ = [
    "DEFAULT_GRAD_SAMPLE_MODE",
    "GradSampleMode",
    "Hyperparameters",
    "LossFn",
    "OptimizerName",
    "TrainSpec",
]

GradSampleMode = Literal["auto", "hooks", "ew", "functorch", "ghost"]
"""Opacus's ways to get per-sample gradient norms (``make_private(grad_sample_mode=...)``),
or ``"auto"``: chosen per trial from the model, batch size and clipping
(:func:`ray_dptune.training.grad_sample.choose_grad_sample_mode`)."""

DEFAULT_GRAD_SAMPLE_MODE: GradSampleMode = "auto"
"""Chosen per model: no single mode is fastest (``benchmarks/results/dpsgd_step.md``).

Expanded weights ("ew") were fastest on the 8 714-parameter digits CNN, but 28-39x
slower than non-private training on a 1 M-parameter MLP at batch 256, where ghost
clipping is ~2x. ``"auto"`` picks ghost when the per-sample gradients it avoids are
large (and the clipping needs none), else ew, else hooks; every mode computes the same
DP-SGD step, so the choice never changes the privacy plan. Expanded weights' caveats
are handled by the loop (``ray_dptune.training.loop``): the wrapped model is never
called for evaluation (its ``_module`` is, under ``torch.no_grad()``), and an empty
Poisson batch, which it rejects, becomes a zero-weighted placeholder batch whose
per-sample gradient is exactly 0.
"""

OptimizerName = Literal["sgd", "adam"]
"""The optimizer DP-SGD's noisy gradients feed; its learning rate is ``config["lr"]``."""

LossFn = Callable[..., torch.Tensor]
"""``loss_fn(logits, targets, reduction="mean")``, e.g. ``torch.nn.functional.cross_entropy``."""

RESERVED_METRICS = ("epoch", PLAN_KEY, SPENT_KEY, PRIVATE_KEY, AUDIT_KEY)
MISSING_HYPERPARAMETER = (
    "config[{key!r}] is required: dp_trainable reads the {what} from the trial's config, e.g. "
    "param_space={{'lr': tune.loguniform(1e-2, 2), 'max_grad_norm': tune.uniform(0.1, 5)}}."
)


@dataclass(frozen=True)
class TrainSpec:
    """Everything :func:`ray_dptune.training.loop.train` needs besides the trial's config.

    Attributes:
        model_fn: config -> ``torch.nn.Module``.
        data_fn: config -> (train, validation) map-style data sets of (input, target).
        loss_fn: ``(logits, targets, reduction="mean") -> loss``; must return the batch mean.
        privacy: the fixed privacy parameters (config keys of the same names override them).
        metric: name of the reported score (validation accuracy).
        grad_sample_mode: Opacus's per-sample gradient mode, or "auto" (default: per model).
        optimizer: "sgd" or "adam".
        seed: seed of initialisation, sampling and noise; None draws fresh entropy.
            A known seed makes the noise predictable: for tests and debugging only.
        audit: canaries inserted into the training set, counted on the last epoch's model
            (:class:`~ray_dptune.training.canaries.CanaryAudit`); None: no audit.
    """

    model_fn: Callable[[Mapping[str, Any]], nn.Module]
    data_fn: Callable[[Mapping[str, Any]], tuple[Dataset[Any], Dataset[Any]]]
    loss_fn: LossFn
    privacy: PrivacyParams
    metric: str = "val_acc"
    grad_sample_mode: GradSampleMode = DEFAULT_GRAD_SAMPLE_MODE
    optimizer: OptimizerName = "sgd"
    seed: int | None = None
    audit: CanaryAudit | None = None

    def __post_init__(self) -> None:
        for name in ("model_fn", "data_fn", "loss_fn"):
            if not callable(getattr(self, name)):
                raise TypeError(f"{name} must be callable, got {getattr(self, name)!r}.")
        if not isinstance(self.metric, str) or not self.metric or self.metric in RESERVED_METRICS:
            raise ValueError(f"metric must be a non-empty name other than {RESERVED_METRICS}, got {self.metric!r}.")
        _check_choice("grad_sample_mode", self.grad_sample_mode, get_args(GradSampleMode))
        _check_choice("optimizer", self.optimizer, get_args(OptimizerName))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be None or an integer >= 0, got {self.seed!r}.")
        if self.audit is not None and not isinstance(self.audit, CanaryAudit):
            raise TypeError(f"audit must be a ray_dptune.training.CanaryAudit or None, got {self.audit!r}.")

    def training_data(self, config: Mapping[str, Any]) -> tuple[Dataset[Any], Dataset[Any], int]:
        """``data_fn(config)`` with the audit's inserted canaries appended to the training set, and the planned size.

        The planned size is the one DP-SGD's plan samples from (q = batch_size / size): the training set's,
        plus every canary, inserted or not (:meth:`~ray_dptune.training.CanaryAudit.planned_size`).
        """
        train_set, val_set = self.data_fn(config)
        if self.audit is None:
            return train_set, val_set, len(cast(Sized, train_set))
        return self.audit.training_set(train_set), val_set, self.audit.planned_size(len(cast(Sized, train_set)))


@dataclass(frozen=True)
class Hyperparameters:
    """The tuned, privacy-neutral hyperparameters the loop requires from the config."""

    lr: float
    max_grad_norm: float

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Hyperparameters:
        """Reads ``config["lr"]`` and ``config["max_grad_norm"]`` (the clipping norm).

        ``max_grad_norm`` is 1 by default with ``config["clipping"] = "automatic"``.

        Raises:
            ValueError: a key is missing or not a finite number > 0.
        """
        values = {}
        for key, what in (("lr", "learning rate"), ("max_grad_norm", "clipping norm")):
            if key == "max_grad_norm" and key not in config and config.get("clipping") == "automatic":
                values[key] = AUTOMATIC_CLIPPING_NORM  # it only rescales the step: not searched
                continue
            if key not in config:
                raise ValueError(MISSING_HYPERPARAMETER.format(key=key, what=what))
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, Real) or not 0 < cast(float, value) < math.inf:
                raise ValueError(f"config[{key!r}] (the {what}) must be a finite number > 0, got {value!r}.")
            values[key] = float(value)
        return cls(**values)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")
