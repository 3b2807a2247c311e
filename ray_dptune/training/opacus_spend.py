"""Bring your own Opacus loop: what its ``PrivacyEngine`` planned and actually spent, for ``tune.report``.

A training loop that already uses Opacus adds three lines::

    from ray_dptune.training import OpacusSpend
    spend = OpacusSpend(engine, optimizer, train_loader, steps=epochs * len(train_loader), config=config)
    tune.report({"val_acc": acc, **spend.report()})        # in every report

What the account trusts and what it checks:

* **Before the first step**: with ``config=`` of a trial of :func:`~ray_dptune.private_tuner`,
  the loader's sampling rate, σ and ``steps`` are checked against the search's plan
  (``config["dp_search_plan"]``); a plan they exceed (e.g. ``opacus_plan`` given the train +
  validation size) raises :class:`~ray_dptune.errors.RefusedBeforeTraining` before any data
  is touched, and the search stops having spent nothing.

* **Read, not typed**: the steps, noise multipliers and sample rates come from the
  engine's own accountant history (Opacus appends one ``(σ, q, steps)`` entry per
  ``optimizer.step()`` that was not skipped, gradient accumulation included), never from
  numbers counted by hand. A σ raised or a q lowered mid-run is reported as that many plan
  steps (each is a post-processing of one); any other change as the composition of what
  ran, which the accountant callback refuses for a DP-SGD plan (no proof it is covered).
* **Refused**: non-Poisson batches (``make_private(poisson_sampling=False)``: Opacus then
  records q = 1/len(loader), but no documented amplification bound covers shuffled
  batches), an accountant without a history, and adaptive clipping
  (``AdaClipDPOptimizer``: its noisy count is a second mechanism the history omits).
* **Trusted**: that the model is trained only through this optimizer, on the loader's
  data, for at most ``steps`` steps (the plan: a trial that reports more raises in the
  accountant callback), and that the validation score is public or noised by the user.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
from opacus.accountants import IAccountant
from opacus.data_loader import DPDataLoader
from opacus.optimizers import AdaClipDPOptimizer, DPOptimizer
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler, UniformWithReplacementSampler
from torch.utils.data import DataLoader, Dataset, Subset

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, describe_excess, parse_report, report_covers
from ray_dptune.accounting.curves.rdp import RDPCurve
from ray_dptune.errors import PrivacyError, RefusedBeforeTraining
from ray_dptune.result_keys import PLAN_KEY, SAMPLE_KEY, SEARCH_PLAN_KEY, SPENT_KEY
from ray_dptune.tuning_sample import TuningSample, planned_sample_size, sample_fraction

__all__ = ["OpacusPlan", "OpacusSpend", "opacus_plan", "tuning_loader"]

_POISSON_SAMPLERS = (UniformWithReplacementSampler, DistributedUniformWithReplacementSampler)


class OpacusSpend:
    """The plan and the spend of one Opacus training run, as the accountant callback reads them.

    Args:
        engine: the ``opacus.PrivacyEngine`` (or any object with an ``accountant``) that
            made ``optimizer`` private.
        optimizer: the ``DPOptimizer`` ``make_private`` returned.
        data_loader: the loader ``make_private`` returned (Poisson sampling).
        steps: the most optimizer steps this run will take (the plan), e.g.
            ``epochs * len(data_loader)``.
        config: the trial's config; when it holds the search's plan (``"dp_search_plan"``, set by
            :func:`~ray_dptune.private_tuner`), this run's plan is checked against it here.

    Raises:
        RefusedBeforeTraining: this run's plan exceeds the search's, and no step has run yet.
        PrivacyError: a configuration the account cannot bound (see the module docstring).
        TypeError: ``optimizer`` is not an Opacus ``DPOptimizer``.
        ValueError: ``steps`` is not a non-negative integer.
    """

    def __init__(
        self,
        engine: Any,
        optimizer: DPOptimizer,
        data_loader: Any,
        *,
        steps: int,
        config: Mapping[str, Any] | None = None,
    ):
        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(f"optimizer must be the DPOptimizer make_private returned, got {type(optimizer).__name__}.")
        if isinstance(optimizer, AdaClipDPOptimizer):
            raise PrivacyError(
                "AdaClipDPOptimizer's noisy unclipped count is a mechanism of its own that Opacus's accountant "
                "history omits; use fixed clipping, or ray_dptune's dp_trainable(clipping='quantile')."
            )
        accountant = getattr(engine, "accountant", None)
        if not isinstance(accountant, IAccountant) or not isinstance(getattr(accountant, "history", None), list):
            raise PrivacyError(
                "engine.accountant has no step history to read (an Opacus RDP, PRV or GDP accountant has one); "
                "build the engine with opacus.PrivacyEngine(accountant='rdp')."
            )
        sampler = getattr(data_loader, "batch_sampler", None)
        if not (isinstance(data_loader, DPDataLoader) or isinstance(sampler, _POISSON_SAMPLERS)):
            raise PrivacyError(
                "The data loader does not sample Poisson batches (make_private(poisson_sampling=False)?): DP-SGD's "
                "amplification by subsampling is proven for Poisson sampling only. Use the loader make_private "
                "returns with poisson_sampling=True (Opacus's default)."
            )
        self._accountant = accountant
        self._plan = TrialSpend(
            sample_rate=1.0 / len(data_loader),  # Opacus's own q (PrivacyEngine.make_private)
            noise_multiplier=float(optimizer.noise_multiplier),
            steps=validate.integer("steps", steps),
        )
        if config is not None and SEARCH_PLAN_KEY in config:
            self._check_search_plan(json.loads(config[SEARCH_PLAN_KEY]))
        if config is not None and sample_fraction(config) is not None:
            self._check_tuning_sample(data_loader, config[SAMPLE_KEY]["sample_id"])

    def _check_tuning_sample(self, data_loader: Any, sample_id: str) -> None:
        """Raises before the first step when a tuning trial's loader is not the sample's (:func:`tuning_loader`).

        Its plan is amplified as a run on the sample: a run on all the data would be discounted by p.
        """
        dataset = getattr(data_loader, "dataset", None)
        if isinstance(dataset, _SampleSubset) and dataset.sample_id == sample_id:
            return
        message = (
            "This trial tunes on a sample (config['dp_tuning_sample']), but its loader is not the sample's: build it "
            "with ray_dptune.training.tuning_loader(train_set, config, batch_size=B) and pass that to make_private."
        )
        if self._accountant.history:
            raise PrivacyError(message + " Steps have already run: they are charged as they ran.")
        raise RefusedBeforeTraining(message + " Refused before the first training step: nothing was spent.")

    def _check_search_plan(self, search_plan: dict[str, Any]) -> None:
        """Raises before the first step when this run may spend past the plan the search was calibrated for."""
        if report_covers(search_plan, self._plan.to_dict()):
            return
        excess = describe_excess(search_plan, self._plan.to_dict())
        message = (
            f"This trial's Opacus run may spend past the search's plan: {excess}. Its plan: {self._plan}; the "
            f"search's: {parse_report(search_plan)}. Check opacus_plan(dataset_size=n, batch_size=B, epochs=E) against the loop: "
            "n is the training split's size (not train + validation), B the DataLoader's batch_size, and steps= "
            "E * len(loader) of the loader make_private returned."
        )
        if self._accountant.history:
            raise PrivacyError(message + " Steps have already run: they are charged as they ran.")
        raise RefusedBeforeTraining(message + " Refused before the first training step: nothing was spent.")

    @property
    def plan(self) -> TrialSpend:
        """The most this run may spend: ``steps`` DP-SGD steps at the optimizer's σ and the loader's q."""
        return self._plan

    def spent(self) -> TrialSpend | RDPCurve:
        """What the accountant's history says ran: one DP-SGD record, or their composition if σ or q changed."""
        history = [(float(sigma), float(rate), int(count)) for sigma, rate, count in self._accountant.history]
        if not history:
            return TrialSpend(sample_rate=self._plan.sample_rate, noise_multiplier=self._plan.noise_multiplier, steps=0)
        steps = sum(count for *_, count in history)
        if len({(sigma, rate) for sigma, rate, _ in history}) == 1:
            sigma, rate, _ = history[0]
            return TrialSpend(sample_rate=rate, noise_multiplier=sigma, steps=steps)
        plan = self._plan
        if all(sigma >= plan.noise_multiplier and rate <= plan.sample_rate for sigma, rate, _ in history):
            # each step is a post-processing of a plan step (more noise, a smaller Poisson rate)
            return TrialSpend(sample_rate=plan.sample_rate, noise_multiplier=plan.noise_multiplier, steps=steps)
        return sum(
            (
                RDPCurve.subsampled_gaussian(sample_rate=rate, noise_multiplier=sigma, steps=count)
                for sigma, rate, count in history
            ),
            start=RDPCurve.zero(),
        )

    def report(self) -> dict[str, dict[str, Any]]:
        """``{"dp_plan": ..., "dp_spent": ...}``: merge it into every ``tune.report`` of the trial."""
        return {PLAN_KEY: self._plan.to_dict(), SPENT_KEY: self.spent().to_dict()}


class _SampleSubset(Subset[Any]):
    """A tuning sample's records, named by the sample's id (what :class:`OpacusSpend` checks a tuning trial uses)."""

    def __init__(self, dataset: Dataset[Any], indices: list[int], sample_id: str) -> None:
        super().__init__(dataset, indices)
        self.sample_id = sample_id


@dataclass(frozen=True)
class OpacusPlan:
    """σ → the plan :class:`OpacusSpend` reports for ``make_private`` on a ``DataLoader(batch_size=...)`` of n records.

    Mirrors ``PrivacyEngine.make_private``: the loader becomes Poisson batches at rate
    1/len(loader) = 1/⌈n/B⌉ (``DPDataLoader.from_data_loader``), whose sampler runs
    len(sampler) batches an epoch, and the accountant's q is 1/len(sampler). The same
    holds per worker with ``distributed=True`` (q is the global batch's rate).
    Build it with :func:`opacus_plan`.
    """

    dataset_size: int
    batch_size: int
    epochs: int

    def __post_init__(self) -> None:
        validate.positive_int("dataset_size", self.dataset_size)
        validate.positive_int("batch_size", self.batch_size, maximum=self.dataset_size)
        validate.integer("epochs", self.epochs)

    @property
    def batches(self) -> int:
        """Batches an epoch (the sampler's length): 1/q."""
        loader_batches = math.ceil(self.dataset_size / self.batch_size)
        return len(UniformWithReplacementSampler(num_samples=self.dataset_size, sample_rate=1.0 / loader_batches))

    def __call__(self, noise_multiplier: float) -> TrialSpend:
        """The plan at ``noise_multiplier``."""
        batches = self.batches
        return TrialSpend(sample_rate=1.0 / batches, noise_multiplier=noise_multiplier, steps=self.epochs * batches)

    def on_sample(self, fraction: float) -> OpacusPlan:
        """The plan of the same loop on a tuning sample of rate ``fraction``: n is its public planned size.

        The loop reads its loader from :func:`tuning_loader`, whose q is this plan's, whatever the
        sample's realised size.
        """
        return OpacusPlan(planned_sample_size(fraction, self.dataset_size), self.batch_size, self.epochs)


def opacus_plan(*, dataset_size: int, batch_size: int, epochs: int) -> OpacusPlan:
    """σ → the plan :class:`OpacusSpend` reports for ``make_private`` on a ``DataLoader(batch_size=...)`` (:class:`OpacusPlan`).

    For :func:`~ray_dptune.private_tuner`'s ``plan_for=`` and ``calibrate_noise_multiplier``.
    """
    return OpacusPlan(dataset_size, batch_size, epochs)


def tuning_loader(
    train_set: Dataset[Any], config: Mapping[str, Any], *, batch_size: int, generator: torch.Generator | None = None
) -> DataLoader[Any]:
    """The loader to give ``make_private``: the tuning sample's in a subsampled search's tuning trial, else the usual one.

    In a trial with ``config["dp_tuning_sample"]`` it is Poisson batches over the sample's records
    at q = 1/⌈m/B⌉, m the sample's public planned size (:meth:`OpacusPlan.on_sample`): a rate fixed
    before the sample is drawn, never read from its realised size. Otherwise (the final run, any
    other search) ``DataLoader(train_set, batch_size=batch_size)``, which ``make_private`` turns
    into Poisson batches at 1/⌈n/B⌉.
    """
    sample = TuningSample.from_config(config)
    if sample is None:
        return DataLoader(train_set, batch_size=batch_size, generator=generator)
    size = len(cast(Sized, train_set))
    plan = OpacusPlan(size, batch_size, 1).on_sample(sample.fraction)
    subset = _SampleSubset(train_set, sample.indices(size).tolist(), sample.sample_id)
    loader: DataLoader[Any] = DPDataLoader(subset, sample_rate=1.0 / plan.batches, generator=generator)
    return loader
