"""``dp_trainable``: the user's model and data as a Ray Tune function trainable with DP-SGD.

The trainable reports, with every ``tune.report``, the score plus its privacy plan
(``"dp_plan"``) and spending (``"dp_spent"``), the protocol that
:class:`~ray_dptune.accounting.spend.TrialSpend` defines; the loop itself is
:func:`ray_dptune.training.loop.train`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ray_dptune.accounting.spend import TrialSpend
from ray_dptune.training.loop import train
from ray_dptune.training.plan import PrivacyParams, space_plan
from ray_dptune.training.spec import DEFAULT_GRAD_SAMPLE_MODE, GradSampleMode, LossFn, OptimizerName, TrainSpec
from ray_dptune.training.state import TrainState

__all__ = ["DPTrainable", "dp_trainable"]


def dp_trainable(
    model_fn: Callable[[Mapping[str, Any]], nn.Module],
    data_fn: Callable[[Mapping[str, Any]], tuple[Dataset, Dataset]],
    loss_fn: LossFn = torch.nn.functional.cross_entropy,
    *,
    noise_multiplier: float,
    batch_size: int,
    epochs: int,
    metric: str = "val_acc",
    score_noise_multiplier: float | None = None,
    grad_sample_mode: GradSampleMode | None = None,
    optimizer: OptimizerName = "sgd",
    seed: int | None = None,
) -> DPTrainable:
    """A Ray Tune function trainable that trains ``model_fn(config)`` with Opacus DP-SGD.

    Each trial samples Poisson batches at q = batch_size / n (n = training-set size),
    clips per-sample gradients to ``config["max_grad_norm"]`` (flat clipping), adds
    Gaussian noise of std ``noise_multiplier * max_grad_norm``, steps with
    ``optimizer`` at ``config["lr"]``, and after each epoch reports the validation
    accuracy as ``metric`` with ``"epoch"``, ``"dp_plan"`` and ``"dp_spent"``, and a
    checkpoint. A trial restored by Tune continues from its last checkpoint, spending included.

    Example:
        .. code-block:: python

            from ray import tune
            from ray_dptune.training import digits_cnn, digits_data, dp_trainable

            trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=2.5, batch_size=64, epochs=15)
            param_space = {"lr": tune.loguniform(1e-2, 2), "max_grad_norm": tune.uniform(0.1, 5)}
            plan = trainable.privacy_plan(param_space)  # TrialSpend covering every trial
            tuner = tune.Tuner(trainable, param_space=param_space,
                               tune_config=tune.TuneConfig(metric="val_acc", mode="max"))

    Args:
        model_fn: config -> ``torch.nn.Module``; BatchNorm and other layers DP-SGD
            cannot train are replaced by ``opacus.validators.ModuleValidator.fix`` (logged).
        data_fn: config -> (train, validation) map-style data sets of (input, target)
            pairs; the training set is private, and so is the validation set when
            ``score_noise_multiplier`` is set. Its size must not depend on the config.
        loss_fn: ``(logits, targets, reduction="mean") -> loss`` returning the batch mean
            (``reduction="none"`` is used by ghost clipping).
        noise_multiplier: σ of DP-SGD; ``config["noise_multiplier"]`` overrides it.
        batch_size: expected Poisson batch size; ``config["batch_size"]`` overrides it.
        epochs: epochs (and reports) per trial; ``config["epochs"]`` overrides it.
        metric: name of the reported validation accuracy.
        score_noise_multiplier: None when the validation data is public; else the σ of
            the Gaussian noise added to each reported correct-count (sensitivity 1),
            accounted in the plan as one release per epoch.
        grad_sample_mode: Opacus's "hooks", "ew", "functorch" or "ghost"; None for
            :data:`~ray_dptune.training.spec.DEFAULT_GRAD_SAMPLE_MODE` (the fastest measured).
        optimizer: "sgd" or "adam".
        seed: seeds initialisation, sampling and noise (tests, debugging); None draws
            fresh entropy. Whoever knows the seed can predict the noise.

    Returns:
        The trainable; also offers :meth:`DPTrainable.privacy_plan`.

    Raises:
        ValueError: invalid settings (checked here, before any trial starts).
    """
    privacy = PrivacyParams(noise_multiplier, batch_size, epochs, score_noise_multiplier)
    spec = TrainSpec(
        model_fn=model_fn,
        data_fn=data_fn,
        loss_fn=loss_fn,
        privacy=privacy,
        metric=metric,
        grad_sample_mode=DEFAULT_GRAD_SAMPLE_MODE if grad_sample_mode is None else grad_sample_mode,
        optimizer=optimizer,
        seed=seed,
    )
    return DPTrainable(spec)


class DPTrainable:
    """A Tune function trainable: ``trainable(config)`` runs one DP-SGD trial.

    A plain callable object (Tune wraps it with ``wrap_function``; ``tune.with_resources``
    sets an attribute on it), holding a picklable :class:`~ray_dptune.training.spec.TrainSpec`.
    """

    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec
        self.__name__ = getattr(spec.model_fn, "__name__", "dp_trainable")  # Tune's trial names

    def __call__(self, config: dict[str, Any]) -> None:
        """Runs one trial in a Tune session, from ``tune.get_checkpoint()`` if there is one."""
        from ray import tune  # imported here: Ray is slow to import and only needed in a session

        checkpoint = tune.get_checkpoint()
        resume = None
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                resume = TrainState.load(directory, "cuda" if torch.cuda.is_available() else "cpu")
        train(config, self.spec, _report_to_tune, resume=resume)

    def privacy_plan(self, param_space: Mapping[str, Any], *, dataset_size: int | None = None) -> TrialSpend:
        """A plan that covers every trial of ``param_space`` (see :func:`~ray_dptune.training.plan.space_plan`).

        Args:
            param_space: the ``param_space`` of ``tune.Tuner``.
            dataset_size: size of the training set; by default ``data_fn`` is called
                with the space's fixed (non-tuned) entries.

        Raises:
            ValueError: the privacy parameters vary so that no trial's plan covers all.
        """
        if dataset_size is None:
            fixed = {key: value for key, value in param_space.items() if _is_fixed(value)}
            dataset_size = len(self.spec.data_fn(fixed)[0])
        return space_plan(param_space, self.spec.privacy, dataset_size)

    def __repr__(self) -> str:
        return f"DPTrainable({self.__name__}, {self.spec.privacy})"


def _report_to_tune(metrics: dict[str, Any], checkpoint_dir: str) -> None:
    from ray import tune

    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))


def _is_fixed(value: Any) -> bool:
    from ray.tune.search.sample import Domain

    return not isinstance(value, Domain) and not (isinstance(value, Mapping) and "grid_search" in value)
