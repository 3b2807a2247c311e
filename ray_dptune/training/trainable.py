"""``dp_trainable``: the user's model and data as a Ray Tune function trainable with DP-SGD.

The trainable reports, with every ``tune.report``, the score plus its privacy plan
(``"dp_plan"``) and spending (``"dp_spent"``), the protocol that
:class:`~ray_dptune.accounting.bookkeeping.spend.TrialSpend` defines; the loop itself is
:func:`ray_dptune.training.loop.train`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sized
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.result_keys import PARTITION_KEY, SAMPLE_KEY
from ray_dptune.training.canaries import CanaryAudit
from ray_dptune.training.loop import train
from ray_dptune.training.partition import Partition, part_sizes
from ray_dptune.training.plan import PrivacyParams, candidates, describe_plans, dominant_plan, space_plan
from ray_dptune.training.spec import DEFAULT_GRAD_SAMPLE_MODE, GradSampleMode, LossFn, OptimizerName, TrainSpec
from ray_dptune.training.state import TrainState
from ray_dptune.tuning_sample import planned_sample_size, sample_fraction

__all__ = ["DPTrainable", "dp_trainable"]


def dp_trainable(
    model_fn: Callable[[Mapping[str, Any]], nn.Module],
    data_fn: Callable[[Mapping[str, Any]], tuple[Dataset[Any], Dataset[Any]]],
    loss_fn: LossFn = torch.nn.functional.cross_entropy,
    *,
    noise_multiplier: float | None = None,
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
    checkpoint. A trial restored by Tune continues from its last checkpoint, spending
    and adaptive clipping state included.

    ``config["clipping"]`` chooses how (:mod:`~ray_dptune.training.clipping`):

    * ``"fixed"`` (default): as above.
    * ``"quantile"``: C_0 = ``max_grad_norm`` follows the ``target_quantile`` (0.5) of
      the per-sample gradient norms at rate ``clipbound_lr`` (0.2), from a count noised
      with std ``unclipped_num_std`` (batch_size / 20; must exceed σ/2) (Andrew et al.
      2021, with Opacus's ``AdaClipDPOptimizer`` corrected to satisfy their Theorem 1).
    * ``"oso"``: OSO-DPSGD (Galli et al., Algorithm 1): C_0 = ``max_grad_norm`` and the
      SGD learning rate ρ_0 = ``lr`` are learned online at rates ``oso_rho_c`` and
      ``oso_rho_r`` (2.5e-3 each), from clipping directions noised with multiplier
      ``oso_noise_multiplier_q`` (≈ 7.124σ; must exceed σ). SGD only.
    * ``"automatic"``: each example's gradient normalised to R·g/(‖g‖ + γ) (Bu et al.
      2023, AUTO-S; γ = ``automatic_stability``, 0.01), R = ``max_grad_norm`` or 1 when
      the config has none: the clipping norm leaves the search space, e.g.
      ``{"lr": tune.loguniform(1e-2, 4), "clipping": "automatic"}``.

    Each mode splits σ so that a step costs exactly one DP-SGD step at σ (Proposition
    1 of Galli et al., Theorem 1 of Andrew et al.): the plan is the same in every mode.

    ``config["dp_partition"] = {"index": i, "count": k}`` trains on part i of k of the
    training set (disjoint parts, each example's fixed by a hash of its content:
    :mod:`~ray_dptune.training.partition`), with q = batch_size / (part size) in its
    plan; the validation set is unchanged. With ``"private": False`` the part trains
    with plain SGD (shuffled batches of batch_size, no clipping or noise) and reports
    ``"dp_private": False`` instead of ``"dp_plan"`` and ``"dp_spent"``: only for a
    searcher whose own mechanism protects the scores (Ding et al.'s sparse vector).

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
        noise_multiplier: σ of DP-SGD; ``config["noise_multiplier"]`` overrides it. Leave it
            out with :func:`ray_dptune.private_tuner`, which calibrates it for the whole search.
        batch_size: expected Poisson batch size; ``config["batch_size"]`` overrides it.
        epochs: epochs (and reports) per trial; ``config["epochs"]`` overrides it.
        metric: name of the reported validation accuracy.
        score_noise_multiplier: None when the validation data is public; else the σ of
            the Gaussian noise added to each reported correct-count (sensitivity 1),
            accounted in the plan as one release per epoch.
        grad_sample_mode: None (the default, "auto") picks Opacus's mode per trial from the model,
            batch size and clipping (:func:`~ray_dptune.training.grad_sample.choose_grad_sample_mode`:
            ghost for large Linear/Embedding models, else "ew", else "hooks"; never ghost for
            quantile/OSO clipping); or force "hooks", "ew", "functorch" or "ghost".
        optimizer: "sgd" or "adam".
        seed: seeds initialisation, sampling and noise (tests, debugging); None draws
            fresh entropy. Whoever knows the seed can predict the noise.

    Returns:
        The trainable; also offers :meth:`DPTrainable.privacy_plan`.

    Raises:
        ValueError: invalid settings (checked here, before any trial starts).
    """
    privacy = PrivacyParams(
        noise_multiplier=noise_multiplier,
        batch_size=batch_size,
        epochs=epochs,
        score_noise_multiplier=score_noise_multiplier,
    )
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

        When ``param_space`` has ``"dp_partition"`` (fixed, ``tune.choice`` or
        ``tune.grid_search``), the plan covers every part it may name, each at its own
        size; parts must be private. With ``"dp_tuning_sample"``, the plan is a trial's on
        that sample, at its planned size (:meth:`~ray_dptune.tuning_sample.TuningSample.planned_size`).

        Args:
            param_space: the ``param_space`` of ``tune.Tuner``.
            dataset_size: size of the training set; by default ``data_fn`` is called
                with the space's fixed (non-tuned) entries. Not with ``"dp_partition"``,
                whose part sizes need the data.

        Raises:
            ValueError: the privacy parameters or parts vary so that no trial's plan
                covers all, or a part is not private.
        """
        fraction = sample_fraction(param_space)
        if fraction is not None:
            if self.spec.audit is not None:
                raise ValueError(f"A canary audit covers a search over the whole training set, not a {SAMPLE_KEY!r}.")
            rest = {key: value for key, value in param_space.items() if key != SAMPLE_KEY}
            size = self.dataset_size(rest) if dataset_size is None else dataset_size
            return space_plan(rest, self.spec.privacy, planned_sample_size(fraction, size))
        if PARTITION_KEY in param_space:
            if self.spec.audit is not None:
                raise ValueError(
                    f"A canary audit covers a search over the whole training set, not {PARTITION_KEY!r} parts."
                )
            return self._partition_plan(param_space, dataset_size)
        if dataset_size is None:
            dataset_size = self.dataset_size(param_space)
        return space_plan(param_space, self.spec.privacy, dataset_size)

    def with_audit(self, audit: CanaryAudit) -> DPTrainable:
        """This trainable with ``audit``'s canaries inserted into every trial's training set (:mod:`ray_dptune.audit`).

        Restore an audited search with it (``tune.Tuner.restore(path,
        trainable.with_audit(CanaryAudit.from_journal(path)))``), else its trials train without the canaries.
        """
        audited = DPTrainable(dataclasses.replace(self.spec, audit=audit))
        # what Tune set on this object stays, e.g. tune.with_resources' request
        audited.__dict__.update({key: value for key, value in vars(self).items() if key != "spec"})
        return audited

    def dataset_size(self, param_space: Mapping[str, Any]) -> int:
        """Size of the training set ``data_fn`` gives for the space's fixed entries.

        With an audit, plus its m canaries: the size the plan samples from.
        """
        return self.spec.training_data(self._fixed(param_space))[2]

    def _partition_plan(self, param_space: Mapping[str, Any], dataset_size: int | None) -> TrialSpend:
        if dataset_size is not None:
            raise ValueError(f"dataset_size cannot be given with {PARTITION_KEY!r}: the part sizes come from data_fn.")
        rest = {key: value for key, value in param_space.items() if key != PARTITION_KEY}
        partitions = [
            Partition.from_config({PARTITION_KEY: value})
            for value in candidates(PARTITION_KEY, param_space[PARTITION_KEY])
        ]
        if any(partition is not None and not partition.private for partition in partitions):
            raise ValueError(
                "A part with 'private': False trains without DP and has no DP-SGD plan; plan only the private trials."
            )
        train_set = self._train_set(rest)
        sizes = {count: part_sizes(train_set, count) for count in {p.count for p in partitions if p is not None}}
        plans = [
            space_plan(
                rest, self.spec.privacy, len(cast(Sized, train_set)) if p is None else int(sizes[p.count][p.index])
            )
            for p in partitions
        ]
        plan = dominant_plan(plans)
        if plan is None:
            raise ValueError(
                f"No part of {PARTITION_KEY!r} spends at least as much as every other one at every Rényi order "
                f"(their sizes give q and the steps per epoch): {describe_plans(dict.fromkeys(plans))}. "
                "Plan each part's trials separately."
            )
        return plan

    def _train_set(self, param_space: Mapping[str, Any]) -> Dataset[Any]:
        return self.spec.data_fn(self._fixed(param_space))[0]

    @staticmethod
    def _fixed(param_space: Mapping[str, Any]) -> dict[str, Any]:
        from ray_dptune.search.space import is_fixed  # imported here: Ray is slow to import

        return {key: value for key, value in param_space.items() if is_fixed(value)}

    def __repr__(self) -> str:
        return f"DPTrainable({self.__name__}, {self.spec.privacy})"


def _report_to_tune(metrics: dict[str, Any], checkpoint_dir: str) -> None:
    from ray import tune

    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))
