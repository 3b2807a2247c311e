"""One trial's DP-SGD training loop, independent of Ray: :func:`train`.

The loop trains with Opacus (``opacus.PrivacyEngine.make_private``: Poisson sampling,
flat clipping, a fixed noise multiplier) and, once per epoch, evaluates, reports the
score with the trial's privacy plan and spending, and saves a checkpoint. Reporting
goes through an injected ``report(metrics, checkpoint_dir)``, so that the loop runs
in tests without Ray; :class:`ray_dptune.training.trainable.DPTrainable` passes
``ray.tune.report``.

A :class:`~ray_dptune.training.state.PrivacyLedger`, attached with
``DPOptimizer.attach_step_hook``, counts every noisy step and refuses
(``PrivacyError``) the step that would exceed the plan before the parameters change.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ray_dptune.accounting.spend import TrialSpend
from ray_dptune.errors import PrivacyError
from ray_dptune.training.plan import PrivacyParams, sampling_schedule, trial_plan
from ray_dptune.training.spec import Hyperparameters, LossFn, TrainSpec
from ray_dptune.training.state import PrivacyLedger, TrainState

__all__ = ["Report", "train", "train_step"]

logger = logging.getLogger(__name__)

Report = Callable[[dict[str, Any], str], None]
"""``report(metrics, checkpoint_dir)``: publish one epoch's metrics and checkpoint directory."""

_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
# Modes whose per-sample gradient code rejects a batch of size 0 (measured with Opacus 1.6).
_EMPTY_BATCH_UNSUPPORTED = frozenset({"ew", "functorch"})
_EVAL_BATCH_SIZE = 1024


@dataclass(frozen=True)
class _PrivateRun:
    """The objects ``make_private`` returns, ready for the epoch loop."""

    model: nn.Module
    optimizer: DPOptimizer
    criterion: Callable[..., Any]
    loader: DataLoader
    zero_weight_empty_batches: bool


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
) -> TrialSpend:
    """Trains one trial with DP-SGD, reporting after every epoch.

    Each report carries ``"epoch"`` (epochs done), ``spec.metric`` (validation accuracy,
    noisy when ``score_noise_multiplier`` is set), ``"dp_plan"`` (the most the trial will
    spend, fixed before training) and ``"dp_spent"`` (spent so far, this report's score
    included), both ``TrialSpend.to_dict()`` records, and comes with a checkpoint.

    Args:
        config: the trial's config; needs ``lr`` and ``max_grad_norm``, and may override
            the privacy parameters (``noise_multiplier``, ``batch_size``, ``epochs``,
            ``score_noise_multiplier``).
        spec: the model, data, loss and fixed settings.
        report: called as ``report(metrics, checkpoint_dir)`` once per epoch; the
            directory is deleted when it returns.
        resume: a checkpoint of this trial to continue from (next epoch, spending kept).

    Returns:
        What the trial spent.

    Raises:
        ValueError: missing or invalid hyperparameters.
        PrivacyError: the run would not match or would exceed its plan.
    """
    hyper = Hyperparameters.from_config(config)
    params = PrivacyParams.resolve(config, spec.privacy)
    train_set, val_set = spec.data_fn(config)
    plan = trial_plan(params, len(train_set))
    if resume is not None and resume.plan != plan:
        raise PrivacyError(f"The checkpoint's plan {resume.plan} differs from this trial's plan {plan}.")
    ledger = PrivacyLedger(plan, resume.spent if resume else None)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    randomness = _Randomness(spec.seed, device)
    run = _prepare_run(config, spec, params, hyper, train_set, resume, randomness, device)
    run.optimizer.attach_step_hook(ledger.step_hook)  # replaces the PrivacyEngine accountant's hook
    if resume is not None and resume.epoch >= params.epochs:
        # Restored after its last report: report it again (nothing new is spent), so that
        # Tune and the accountant see the trial finish with its plan spent.
        _report_state(report, spec.metric, resume)
    for epoch in range(resume.epoch if resume else 0, params.epochs):
        randomness.start_epoch(epoch)
        _train_epoch(run, device)
        correct = _count_correct(run.model._module, val_set, device)
        score = _release_score(correct, len(val_set), params.score_noise_multiplier, ledger, randomness)
        module_state, optimizer_state = run.model._module.state_dict(), run.optimizer.original_optimizer.state_dict()
        _report_state(
            report, spec.metric, TrainState(epoch + 1, score, plan, ledger.spent, module_state, optimizer_state)
        )
    return ledger.spent


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
    train_set: Dataset,
    resume: TrainState | None,
    randomness: _Randomness,
    device: torch.device,
) -> _PrivateRun:
    """Model, optimizer and Poisson loader, restored from ``resume`` and made private."""
    model = _compatible_model(spec.model_fn(config)).to(device)
    optimizer = _OPTIMIZERS[spec.optimizer](model.parameters(), lr=hyper.lr)
    if resume is not None:
        model.load_state_dict(resume.model_state)
        optimizer.load_state_dict(resume.optimizer_state)
    sample_rate, steps_per_epoch = sampling_schedule(len(train_set), params.batch_size)
    # Built here so that q is exactly batch_size / n; make_private(poisson_sampling=True)
    # would rebuild it at q = 1 / ceil(n / batch_size).
    loader = DPDataLoader(train_set, sample_rate=sample_rate, generator=randomness.sampling)
    ghost = spec.grad_sample_mode == "ghost"
    private = PrivacyEngine(accountant="rdp").make_private(
        module=model,
        optimizer=optimizer,
        criterion=_ReducibleLoss(spec.loss_fn),  # used by ghost clipping only
        data_loader=loader,
        noise_multiplier=params.noise_multiplier,
        max_grad_norm=hyper.max_grad_norm,
        poisson_sampling=False,  # the loader above already samples
        clipping="flat",
        grad_sample_mode=spec.grad_sample_mode,
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
    return _PrivateRun(model, dp_optimizer, criterion, loader, spec.grad_sample_mode in _EMPTY_BATCH_UNSUPPORTED)


def _report_state(report: Report, metric: str, state: TrainState) -> None:
    """Reports one epoch's metrics with ``state`` saved as the checkpoint."""
    metrics = {
        "epoch": state.epoch,
        metric: state.score,
        "dp_plan": state.plan.to_dict(),
        "dp_spent": state.spent.to_dict(),
    }
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


def _train_epoch(run: _PrivateRun, device: torch.device) -> None:
    """One pass of the Poisson loader: one noisy step per batch, empty batches included."""
    for inputs, targets in run.loader:
        _step_on_batch(run, inputs, targets, device)


def _step_on_batch(run: _PrivateRun, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device) -> None:
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
def _count_correct(module: nn.Module, dataset: Dataset, device: torch.device) -> int:
    """Number of examples whose arg-max logit is the target; ``module`` is the unwrapped model."""
    module.eval()
    correct = 0
    for inputs, targets in DataLoader(dataset, batch_size=_EVAL_BATCH_SIZE):
        logits = module(inputs.to(device))
        correct += int((logits.argmax(dim=1) == targets.to(device)).sum())
    module.train()
    return correct


def _release_score(
    correct: int,
    total: int,
    score_noise_multiplier: float | None,
    ledger: PrivacyLedger,
    randomness: _Randomness,
) -> float:
    """Accuracy; with a score σ, (correct + N(0, σ²)) / total, the Gaussian mechanism on a count."""
    if score_noise_multiplier is None:
        return correct / total
    ledger.release_score()
    return (correct + randomness.gaussian(score_noise_multiplier)) / total


def _derive_seed(*entropy: int) -> int:
    """A 64-bit seed per (seed, stream[, epoch]), via numpy's SeedSequence."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(1, dtype=np.uint64)[0])
