"""One trial's DP-SGD training loop, independent of Ray: :func:`train`.

The loop trains with Opacus (``opacus.PrivacyEngine.make_private``: Poisson sampling,
a fixed noise multiplier, and the clipping of ``config["clipping"]``, see
:mod:`~ray_dptune.training.clipping`) on the training set or one part of it
(:mod:`~ray_dptune.training.partition`) and, once per epoch, evaluates, reports the
score with the trial's privacy plan and spending, and saves a checkpoint. Reporting
goes through an injected ``report(metrics, checkpoint_dir)``, so that the loop runs
in tests without Ray; :class:`ray_dptune.training.trainable.DPTrainable` passes
``ray.tune.report``.

A :class:`~ray_dptune.training.state.SpendGuard`, attached with
``DPOptimizer.attach_step_hook``, counts every noisy step and refuses
(``PrivacyError``) the step that would exceed the plan before the parameters change.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from ray_dptune.accounting.bookkeeping.spend import TrialSpend, sampling_schedule
from ray_dptune.audit.counts import AuditCounts
from ray_dptune.errors import PrivacyError
from ray_dptune.result_keys import AUDIT_KEY, PARTITION_KEY, PLAN_KEY, PRIVATE_KEY, SAMPLE_KEY, SPENT_KEY
from ray_dptune.training.canaries import CanaryScorer
from ray_dptune.training.clipping import (
    Clipping,
    FixedClipping,
    clipping_from_config,
    clipping_state,
    restore_clipping_state,
)
from ray_dptune.training.grad_sample import resolve_grad_sample_mode
from ray_dptune.training.partition import Partition
from ray_dptune.training.plan import PrivacyParams, trial_plan
from ray_dptune.training.spec import Hyperparameters, LossFn, OptimizerName, TrainSpec
from ray_dptune.training.state import SpendGuard, TrainState
from ray_dptune.tuning_sample import TuningSample

__all__ = ["Report", "train", "train_step"]

logger = logging.getLogger(__name__)

Report = Callable[[dict[str, Any], str], None]
"""``report(metrics, checkpoint_dir)``: publish one epoch's metrics and checkpoint directory."""

_OPTIMIZERS: dict[OptimizerName, type[torch.optim.SGD | torch.optim.Adam]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
}
# Modes whose per-sample gradient code rejects a batch of size 0 (measured with Opacus 1.6).
_EMPTY_BATCH_UNSUPPORTED = frozenset({"ew", "functorch"})
_EVAL_BATCH_SIZE = 1024
_FIXED_CLIPPING = FixedClipping()


@dataclass(frozen=True)
class _Run:
    """What the epoch loop trains with: ``make_private``'s objects, or plain ones for a non-private part."""

    model: nn.Module  # what trains: a GradSampleModule when private
    module: nn.Module  # the plain model, evaluated and checkpointed
    optimizer: torch.optim.Optimizer  # a DPOptimizer when private
    inner_optimizer: torch.optim.Optimizer  # the non-private optimizer, checkpointed
    criterion: Callable[..., Any]
    loader: DataLoader[Any]
    zero_weight_empty_batches: bool
    grad_sample_mode: str | None = None  # the resolved Opacus mode when private


class _Randomness:
    """Generators for Poisson sampling and noise; re-seeded per epoch when a seed is given.

    Per-epoch seeds make a run resumed from a checkpoint identical to one that was
    never interrupted. Without a seed, generators draw fresh entropy once.
    """

    def __init__(self, seed: int | None, device: torch.device) -> None:
        self.seed = seed
        self.sampling = torch.Generator()
        self.noise = torch.Generator(device=device)
        if seed is None:
            self.sampling.seed()
            self.noise.seed()
        else:
            torch.manual_seed(_derive_seed(seed, 0))  # the model's initialisation

    def start_epoch(self, epoch: int) -> None:
        if self.seed is not None:
            torch.manual_seed(_derive_seed(self.seed, 1, epoch))  # the model's own randomness (dropout)
            self.sampling.manual_seed(_derive_seed(self.seed, 2, epoch))
            self.noise.manual_seed(_derive_seed(self.seed, 3, epoch))

    def gaussian(self, std: float) -> float:
        return std * float(torch.randn((), generator=self.sampling))


class _ReducibleLoss(nn.Module):
    """A functional loss as the criterion ghost clipping needs: with a ``reduction`` it sets.

    ``opacus.utils.fast_gradient_clipping_utils.DPLossFastGradientClipping`` switches
    ``criterion.reduction`` to "none" to get per-sample losses; a plain function would
    ignore the attribute and return the mean.
    """

    def __init__(self, loss_fn: LossFn) -> None:
        super().__init__()
        self.loss_fn = loss_fn
        self.reduction = "mean"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(logits, targets, reduction=self.reduction)


def train(
    config: Mapping[str, Any],
    spec: TrainSpec,
    report: Report,
    *,
    resume: TrainState | None = None,
) -> TrialSpend | None:
    """Trains one trial with DP-SGD, reporting after every epoch.

    Each report carries ``"epoch"`` (epochs done), ``spec.metric`` (validation accuracy,
    noisy when ``score_noise_multiplier`` is set), ``"dp_plan"`` (the most the trial will
    spend, fixed before training) and ``"dp_spent"`` (spent so far, this report's score
    included), both ``TrialSpend.to_dict()`` records, and comes with a checkpoint. A
    non-private part (``config["dp_partition"]["private"]`` False) trains with plain
    SGD and reports ``"dp_private": False`` instead of the two records.

    Args:
        config: the trial's config; needs ``lr`` and ``max_grad_norm``, and may override
            the privacy parameters (``noise_multiplier``, ``batch_size``, ``epochs``,
            ``score_noise_multiplier``) and set ``clipping`` and its keys
            (:mod:`~ray_dptune.training.clipping`), ``dp_partition``
            (:mod:`~ray_dptune.training.partition`) or ``dp_tuning_sample``
            (:mod:`~ray_dptune.tuning_sample`).
        spec: the model, data, loss and fixed settings.
        report: called as ``report(metrics, checkpoint_dir)`` once per epoch; the
            directory is deleted when it returns.
        resume: a checkpoint of this trial to continue from (next epoch, spending and
            adaptive clipping state kept).

    Returns:
        What the trial spent; None for a non-private part.

    Raises:
        ValueError: missing or invalid hyperparameters, clipping options or partition.
        PrivacyError: the run would not match or would exceed its plan.
    """
    hyper, params, partition, clipping = _settings(config, spec)
    if partition is not None and spec.audit is not None:
        raise ValueError(f"A canary audit covers a search over the whole training set, not {PARTITION_KEY!r} parts.")
    sample = TuningSample.from_config(config)  # its seed from the driver, before any record is read
    train_set, val_set, planned_size = spec.training_data(config)
    if partition is not None:
        train_set = partition.subset(train_set)
        planned_size = len(train_set)
    if sample is not None:  # q from the sample's public planned size, never from its realised one
        if spec.audit is not None:
            raise ValueError(f"A canary audit covers a search over the whole training set, not a {SAMPLE_KEY!r}.")
        planned_size = sample.planned_size(len(cast(Sized, train_set)))
        train_set = Subset(train_set, sample.indices(len(cast(Sized, train_set))).tolist())
    plan = None if clipping is None else trial_plan(params, planned_size)
    if resume is not None and resume.plan != plan:
        raise PrivacyError(f"The checkpoint's plan {resume.plan} differs from this trial's plan {plan}.")
    guard = None if plan is None else SpendGuard(plan, resume.spent if resume else None)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    randomness = _Randomness(spec.seed, device)
    if clipping is not None:
        assert guard is not None
        run = _prepare_run(
            config,
            spec,
            params,
            hyper,
            train_set,
            resume,
            randomness,
            device,
            clipping=clipping,
            planned_size=planned_size,
        )
        # Replaces the PrivacyEngine accountant's hook.
        cast(DPOptimizer, run.optimizer).attach_step_hook(guard.step_hook)
    else:
        run = _prepare_plain_run(config, spec, params, hyper, train_set, resume, randomness, device)
    initial = _initial_weights(spec, run.module, resume)
    audit = None
    if spec.audit is not None:
        audit = CanaryScorer(
            spec.audit, like=train_set[0][0], loss_fn=spec.loss_fn, start=_start_model(config, spec, initial, device)
        )
    if resume is not None and resume.epoch >= params.epochs:
        # Restored after its last report: report it again (nothing new is spent), so that
        # Tune and the accountant see the trial finish with its plan spent.
        _report_state(report, spec.metric, resume, audit=None if audit is None else audit.counts(run.module))
    for epoch in range(resume.epoch if resume else 0, params.epochs):
        randomness.start_epoch(epoch)
        _train_epoch(run, device)
        correct = _count_correct(run.module, val_set, device)
        score = _release_score(correct, len(cast(Sized, val_set)), params.score_noise_multiplier, guard, randomness)
        state = TrainState(
            epoch + 1,
            score,
            plan,
            None if guard is None else guard.spent,
            run.module.state_dict(),
            run.inner_optimizer.state_dict(),
            None if clipping is None else clipping_state(clipping, run.optimizer),
            initial,
        )
        counts = audit.counts(run.module) if audit is not None and epoch + 1 == params.epochs else None
        _report_state(report, spec.metric, state, audit=counts)
    return None if guard is None else guard.spent


def _settings(
    config: Mapping[str, Any], spec: TrainSpec
) -> tuple[Hyperparameters, PrivacyParams, Partition | None, Clipping | None]:
    """The trial's settings, all validated before any data is touched; no clipping for a non-private part."""
    hyper = Hyperparameters.from_config(config)
    params = PrivacyParams.resolve(config, spec.privacy)
    partition = Partition.from_config(config)
    if partition is not None and not partition.private:
        if params.score_noise_multiplier is not None:
            raise ValueError(
                f"A non-private part (config['{PARTITION_KEY}']['private'] = False) reports no privacy plan, so "
                "its score cannot be a private release: use a public validation set (score_noise_multiplier=None)."
            )
        return hyper, params, partition, None
    assert params.noise_multiplier is not None  # PrivacyParams.resolve requires it
    clipping = clipping_from_config(
        config,
        noise_multiplier=params.noise_multiplier,
        batch_size=params.batch_size,
        grad_sample_mode=spec.grad_sample_mode,
        optimizer=spec.optimizer,
    )
    return hyper, params, partition, clipping


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    criterion: Callable[..., Any],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    loss_weight: float = 1.0,
) -> None:
    """One optimisation step: zero the gradients, forward, backward, step.

    Private or not, depending on the objects passed (``benchmarks/dpsgd_step.py`` times both).
    """
    optimizer.zero_grad(set_to_none=True)
    loss = criterion(model(inputs), targets)
    if loss_weight != 1.0:
        loss = loss * loss_weight
    loss.backward()
    optimizer.step()


def _prepare_run(
    config: Mapping[str, Any],
    spec: TrainSpec,
    params: PrivacyParams,
    hyper: Hyperparameters,
    train_set: Dataset[Any],
    resume: TrainState | None,
    randomness: _Randomness,
    device: torch.device,
    *,
    clipping: Clipping = _FIXED_CLIPPING,
    planned_size: int | None = None,
) -> _Run:
    """Model, optimizer and Poisson loader, restored from ``resume`` and made private.

    The loader samples ``train_set`` at q = batch_size / ``planned_size`` (default: its size; more with an
    audit's canaries).
    """
    model, optimizer = _model_and_optimizer(config, spec, hyper, resume, device)
    planned_size = len(cast(Sized, train_set)) if planned_size is None else planned_size
    sample_rate, steps_per_epoch = sampling_schedule(planned_size, params.batch_size)
    # Built here so that q is exactly batch_size / n; make_private(poisson_sampling=True)
    # would rebuild it at q = 1 / ceil(n / batch_size).
    loader = DPDataLoader(train_set, sample_rate=sample_rate, generator=randomness.sampling)
    # "auto" -> one of Opacus's modes, from the model and batch size only (no data, no timing).
    choice = resolve_grad_sample_mode(
        spec.grad_sample_mode, model, batch_size=params.batch_size, clipping=clipping.mode
    )
    logger.info("grad_sample_mode=%r (%s)", choice.mode, choice.reason)
    ghost = choice.mode == "ghost"
    private = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=optimizer,
        criterion=_ReducibleLoss(spec.loss_fn),  # used by ghost clipping only
        data_loader=loader,
        noise_multiplier=params.noise_multiplier,
        max_grad_norm=hyper.max_grad_norm,
        poisson_sampling=False,  # the loader above already samples
        clipping="flat",
        grad_sample_mode=choice.mode,
        noise_generator=randomness.noise,
    )
    if ghost:
        model, dp_optimizer, criterion, loader = private
    else:
        (model, dp_optimizer, loader), criterion = private, spec.loss_fn
    # make_private averages over int(n / len(loader)), not over the expected batch size q·n.
    dp_optimizer.expected_batch_size = params.batch_size
    if len(loader) != steps_per_epoch or loader.sample_rate != sample_rate:
        raise PrivacyError(
            f"Opacus's loader takes {len(loader)} steps per epoch at q = {loader.sample_rate}; "
            f"the plan assumed {steps_per_epoch} at q = {sample_rate}."
        )
    dp_optimizer = clipping.wrap(dp_optimizer)
    if ghost:  # the loss zeroes gradients between its two backward passes through the optimizer that steps
        criterion = DPLossFastGradientClipping(model, dp_optimizer, criterion.criterion, criterion.loss_reduction)
    if resume is not None:
        restore_clipping_state(clipping, dp_optimizer, resume.clipping_state)
    empty_batch_placeholder = choice.mode in _EMPTY_BATCH_UNSUPPORTED
    return _Run(model, model._module, dp_optimizer, optimizer, criterion, loader, empty_batch_placeholder, choice.mode)


def _prepare_plain_run(
    config: Mapping[str, Any],
    spec: TrainSpec,
    params: PrivacyParams,
    hyper: Hyperparameters,
    train_set: Dataset[Any],
    resume: TrainState | None,
    randomness: _Randomness,
    device: torch.device,
) -> _Run:
    """Model, optimizer and shuffled loader of plain (non-private) SGD, restored from ``resume``."""
    model, optimizer = _model_and_optimizer(config, spec, hyper, resume, device)
    loader = DataLoader(train_set, batch_size=params.batch_size, shuffle=True, generator=randomness.sampling)
    return _Run(model, model, optimizer, optimizer, spec.loss_fn, loader, False)


def _model_and_optimizer(
    config: Mapping[str, Any],
    spec: TrainSpec,
    hyper: Hyperparameters,
    resume: TrainState | None,
    device: torch.device,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model (as DP-SGD can train it, private or not) and its optimizer, restored from ``resume``."""
    model = _compatible_model(spec.model_fn(config)).to(device)
    optimizer = _OPTIMIZERS[spec.optimizer](model.parameters(), lr=hyper.lr)
    if resume is not None:
        model.load_state_dict(resume.model_state)
        optimizer.load_state_dict(resume.optimizer_state)
    return model, optimizer


def _report_state(report: Report, metric: str, state: TrainState, *, audit: AuditCounts | None = None) -> None:
    """Reports one epoch's metrics with ``state`` saved as the checkpoint (and the last epoch's canary counts)."""
    metrics: dict[str, Any] = {"epoch": state.epoch, metric: state.score}
    if audit is not None:
        metrics[AUDIT_KEY] = audit.to_dict()
    if state.plan is None:
        metrics[PRIVATE_KEY] = False
    else:
        assert state.spent is not None  # recorded with every plan
        metrics.update({PLAN_KEY: state.plan.to_dict(), SPENT_KEY: state.spent.to_dict()})
    with tempfile.TemporaryDirectory() as directory:
        state.save(directory)
        report(metrics, directory)


def _compatible_model(model: nn.Module) -> nn.Module:
    """The model, with layers DP-SGD cannot train replaced (``ModuleValidator.fix``).

    Raises:
        opacus.validators.errors.UnsupportedModuleError: some layer cannot be fixed.
    """
    errors = ModuleValidator.validate(model, strict=False)
    if not errors:
        return model
    model = ModuleValidator.fix(model)
    logger.warning(
        "Opacus's ModuleValidator.fix changed the model for DP-SGD (e.g. BatchNorm -> GroupNorm): %s",
        "; ".join(str(error) for error in errors),
    )
    ModuleValidator.validate(model, strict=True)
    return model


def _train_epoch(run: _Run, device: torch.device) -> None:
    """One pass of the loader: for DP-SGD one noisy step per Poisson batch, empty batches included."""
    for inputs, targets in run.loader:
        _step_on_batch(run, inputs, targets, device)


def _step_on_batch(run: _Run, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device) -> None:
    """One noisy step on one Poisson batch.

    An empty batch must still be a noise-only step (skipping it would reveal that the
    batch was empty, which no accounting covers). For modes that reject empty batches,
    the step runs on a one-example placeholder of zeros whose loss is weighted by 0:
    its per-sample gradient is exactly 0, so the released sum is the same noise.
    """
    inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
    if run.zero_weight_empty_batches and len(targets) == 0:
        placeholder_inputs = inputs.new_zeros((1, *inputs.shape[1:]))
        placeholder_targets = targets.new_zeros((1, *targets.shape[1:]))
        train_step(run.model, run.optimizer, run.criterion, placeholder_inputs, placeholder_targets, loss_weight=0.0)
    else:
        train_step(run.model, run.optimizer, run.criterion, inputs, targets)


@torch.no_grad()
def _count_correct(module: nn.Module, dataset: Dataset[Any], device: torch.device) -> int:
    """Number of examples whose arg-max logit is the target; ``module`` is the unwrapped model."""
    module.eval()
    correct = 0
    for inputs, targets in DataLoader(dataset, batch_size=_EVAL_BATCH_SIZE):
        logits = module(inputs.to(device))
        correct += int((logits.argmax(dim=1) == targets.to(device)).sum())
    module.train()
    return correct


def _initial_weights(spec: TrainSpec, module: nn.Module, resume: TrainState | None) -> dict[str, Any] | None:
    """The weights the trial started from, for a white-box audit (kept in every checkpoint); else None."""
    if spec.audit is None or spec.audit.method != "white-box":
        return None
    if resume is not None:
        if resume.initial_model_state is None:
            raise ValueError("A white-box audit needs the trial's initial weights, which this checkpoint lacks.")
        return resume.initial_model_state
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def _start_model(
    config: Mapping[str, Any], spec: TrainSpec, initial: dict[str, Any] | None, device: torch.device
) -> nn.Module | None:
    """The model as the trial started, built as the loop builds it (a white-box audit's θ₀), or None."""
    if initial is None:
        return None
    start = _compatible_model(spec.model_fn(config)).to(device)
    start.load_state_dict(initial)
    return start


def _release_score(
    correct: int,
    total: int,
    score_noise_multiplier: float | None,
    guard: SpendGuard | None,
    randomness: _Randomness,
) -> float:
    """Accuracy; with a score σ, (correct + N(0, σ²)) / total, the Gaussian mechanism on a count."""
    if score_noise_multiplier is None:
        return correct / total
    assert guard is not None  # a non-private part has no score noise (_settings)
    guard.release_score()
    return (correct + randomness.gaussian(score_noise_multiplier)) / total


def _derive_seed(*entropy: int) -> int:
    """A 64-bit seed per (seed, stream[, epoch]), via numpy's SeedSequence."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0])
