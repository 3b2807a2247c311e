"""SubsampledTuningSearcher: tune on a secret Poisson sample of the data, then train once on all of it.

A random-count search (Papernot & Steinke 2022) whose K trials train on one Poisson sample of
rate p of the training set (``config["dp_tuning_sample"]``, honoured by
:func:`ray_dptune.training.dp_trainable`), at their own noise σ_T; then one final trial trains
the best configuration on all the data at σ_B, with the extrapolation fixed before the search.
The final trial is the released one. The whole procedure is bounded by
:class:`~ray_dptune.accounting.bookkeeping.search_mechanism.SubsampledTuningMechanism`:
amplification by subsampling of the tuning's profile, composed with the final run's privacy
loss distribution (:mod:`~ray_dptune.accounting.bounds.subsampled_tuning`).
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.result_keys import NOISE_KEY, SAMPLE_KEY, SEARCH_PLAN_KEY
from ray_dptune.search.base import RunCountSearcher
from ray_dptune.search.space import sample_config
from ray_dptune.tuning_sample import TuningSample

__all__ = ["Extrapolation", "SubsampledTuningSearcher"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Extrapolation:
    """How the best tuning configuration becomes the final run's, fixed before the search.

    The final run keeps every tuned hyperparameter (batch size and epochs included: on all the
    data that is 1/p times the steps) and trains at the final noise multiplier; the learning
    rate is multiplied by ``learning_rate_scale`` (1: unchanged).
    """

    learning_rate_scale: float = 1.0
    learning_rate_key: str = "lr"

    def __post_init__(self) -> None:
        validate.finite_positive("learning_rate_scale", self.learning_rate_scale)

    def final_config(self, tuned: Mapping[str, Any], *, noise_multiplier: float) -> dict[str, Any]:
        """The final run's config: ``tuned`` without its sample, at ``noise_multiplier``, the learning rate scaled."""
        config = {key: copy.deepcopy(value) for key, value in tuned.items() if key != SAMPLE_KEY}
        config[NOISE_KEY] = float(noise_multiplier)
        if self.learning_rate_scale != 1.0 and isinstance(config.get(self.learning_rate_key), (int, float)):
            config[self.learning_rate_key] = float(config[self.learning_rate_key]) * self.learning_rate_scale
        return config


class SubsampledTuningSearcher(RunCountSearcher):
    """K ~ ``distribution`` trials on a secret Poisson sample of rate ``tuning_fraction``, then one final trial.

    The sample's 128-bit seed comes from the OS's secure source (or ``seed``, for tests); the
    tuning trials' configs carry the sample's id and fraction, and read the seed from this
    driver (:meth:`~ray_dptune.tuning_sample.TuningSample.keep`), so no config, log or folder
    name holds it; the searcher's saved state does, and ``release_best(..., purge=True)``
    deletes it. After the K tuning trials end, the best (by ``metric``
    and ``mode``; a failed trial ranks last) is extrapolated (:class:`Extrapolation`) and
    trained on all the data at ``final_noise_multiplier``: the released trial. K = 0, or no
    tuning trial with a score, trains a configuration drawn from the space, independent of
    the data. Tune's retries are refused, as for every random-count search.

    :func:`ray_dptune.private_tuner` builds it from ``tuning_fraction=`` and calibrates both
    noise multipliers; built by hand, give the final run's plan and σ_B, and put σ_T into
    ``param_space`` as ``"noise_multiplier"``.

    Args:
        distribution: the law of K, e.g. ``Poisson(mean=8)``.
        tuning_fraction: p in (0, 1), each record's chance to be in the tuning sample.
        final_plan: the final run's DP-SGD plan on all the data (no score releases).
        final_noise_multiplier: σ_B, the final run's noise multiplier (``final_plan``'s).
        extrapolation: how the best configuration becomes the final one (default: unchanged).
        metric: the score to select the best tuning trial on (or None, to take ``tune.TuneConfig``'s).
        mode: "max" or "min" (or None, to take ``tune.TuneConfig``'s).
        space: Tune's search space, when not given through ``param_space``.
        seed: for tests and reproducibility; None draws K and the sample's seed from the OS's secure source.
    """

    density_ratio = 1.0  # the tuning draws every configuration from the prior
    threat_model = (
        "training set (add/remove one example): the tuning trials run DP-SGD within one plan on a secret "
        "Poisson sample of the training set, and only the final trial, trained with DP-SGD on all of it, is "
        "released (validation scores are public)"
    )
    coverage = (
        "The guarantee covers the released output only: the final trial's configuration, score and "
        "checkpoint, as returned by ray_dptune.release_best. The tuning trials' models and scores, which Ray "
        "keeps on disk, are not covered (release_best(..., purge=True) deletes the trials' folders). The "
        "sample's seed is part of the mechanism's secret randomness: it is never in a config, and the "
        "searcher's saved state that holds it is deleted by the purge."
    )

    def __init__(
        self,
        distribution: RunCountDistribution,
        *,
        tuning_fraction: float,
        final_plan: TrialSpend,
        final_noise_multiplier: float,
        extrapolation: Extrapolation | None = None,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        seed: int | None = None,
    ):
        if not isinstance(distribution, RunCountDistribution):
            raise TypeError(
                f"distribution must be a law of K such as Poisson(mean=8), got {type(distribution).__name__}."
            )
        if not isinstance(final_plan, TrialSpend):
            raise TypeError(f"final_plan must be a TrialSpend (the final run's plan), got {type(final_plan).__name__}.")
        sigma = validate.finite_positive("final_noise_multiplier", final_noise_multiplier)
        if not math.isclose(final_plan.noise_multiplier, sigma, rel_tol=1e-12):
            raise ValueError(
                f"final_noise_multiplier={sigma} differs from final_plan's σ = {final_plan.noise_multiplier}: the "
                "final trial trains at the σ its plan states."
            )
        super().__init__(metric=metric, mode=mode, seed=seed)
        self._draw_count(distribution)
        self._tuning_trials = self._num_trials
        self._num_trials += 1  # and the final trial
        self._final_plan = final_plan
        self._mechanism = SearchMechanism.subsampled_tuning(
            law=distribution, num_trials=self._tuning_trials, sample_rate=tuning_fraction, final_plan=final_plan
        )
        self._sample = TuningSample.draw(tuning_fraction, rng=None if seed is None else self._rng)
        self._extrapolation = extrapolation or Extrapolation()
        self._scores: dict[str, float | None] = {}  # tuning trial -> its final score (None: failed)
        self._final_trial_id: str | None = None
        if space is not None:
            self._set_space(space)

    @property
    def tuning_fraction(self) -> float:
        """p, each record's chance to be in the tuning sample."""
        return self._sample.fraction

    @property
    def reported_seed(self) -> str:
        """Withheld when set: the sample's seed derives from it, and the report outlives the purge."""
        return (
            "secure (operating system)" if self._seed is None else "set by the operator (withheld: it names the sample)"
        )

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any) -> bool:
        """Tune's metric, mode and space; a space that sets the tuning sample is refused (the searcher draws it)."""
        if config and SAMPLE_KEY in config:
            raise ValueError(f"param_space must not set {SAMPLE_KEY!r}: the searcher draws the tuning sample.")
        return super().set_search_properties(metric, mode, config, **spec)

    def final_trial(self, config: Mapping[str, Any]) -> bool:
        """True for the final trial: the one config without a tuning sample."""
        return SAMPLE_KEY not in config

    def planned_spaces(self, param_space: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The tuning trials' space: Tune's, on the sample."""
        return [{**param_space, SAMPLE_KEY: self._sample.to_config()}]

    def privacy_mechanism(self) -> SearchMechanism:
        """K tuning runs on the sample (P&S Thms 2/6), amplified, composed with the final run."""
        return self._mechanism

    def privacy_details(self) -> dict[str, Any]:
        """The sample's rate, the final plan, the extrapolation, and the released trial once suggested."""
        details: dict[str, Any] = {
            "algorithm": "random-count search on a Poisson sample, then one DP-SGD run on all the data",
            "tuning_fraction": self._sample.fraction,
            "final_plan": self._final_plan.to_dict(),
            "learning_rate_scale": self._extrapolation.learning_rate_scale,
            "seed": self.reported_seed,
        }
        if self._final_trial_id is not None:
            details["released_trial_id"] = self._final_trial_id
        return details

    def _done(self) -> bool:
        return self._final_trial_id is not None

    def _propose(self, trial_id: str) -> tuple[dict[str, Any], Any] | None:
        assert self._space is not None  # suggest() refuses to propose without a space
        if len(self._suggested) < self._tuning_trials:
            self._sample.keep()  # the trials read the seed from the driver, never from their config
            config = {**sample_config(self._space, self._rng), SAMPLE_KEY: self._sample.to_config()}
            return config, config
        if len(self._scores) < self._tuning_trials:
            return None  # tuning trials still running
        best = self._best_tuning_config()
        config = self._extrapolation.final_config(best, noise_multiplier=self._final_plan.noise_multiplier)
        if SEARCH_PLAN_KEY in self._space:  # a loop of your own checks its loader against the final run's plan
            config[SEARCH_PLAN_KEY] = json.dumps(self._final_plan.to_dict())
        self._final_trial_id = trial_id
        logger.info("Subsampled tuning: final trial %s trains on all the data.", trial_id)
        return config, "final"

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Records a tuning trial's final score (None when it failed or reported none)."""
        if not isinstance(self._suggested.get(trial_id), dict) or trial_id in self._scores:
            return
        if result is None and not error:
            return  # removed before it ran (the experiment is stopping): a resumed run reports it
        score = None if error or result is None else result.get(self._metric or "")
        self._scores[trial_id] = float(score) if isinstance(score, (int, float)) and math.isfinite(score) else None

    def _best_tuning_config(self) -> dict[str, Any]:
        """The best tuning trial's config; a draw from the space when none has a score (data-independent)."""
        assert self._space is not None
        scored = [(score, trial_id) for trial_id, score in self._scores.items() if score is not None]
        if not scored:
            return sample_config(self._space, self._rng)
        sign = 1.0 if self._mode == "max" else -1.0
        order = {trial_id: index for index, trial_id in enumerate(self._suggested)}  # the first of equals
        _, best = max(scored, key=lambda pair: (sign * pair[0], -order[pair[1]]))
        tuned: dict[str, Any] = self._suggested[best]
        return tuned

    def _extra_state(self) -> dict[str, Any]:
        return {
            **super()._extra_state(),
            "tuning_trials": self._tuning_trials,
            "final_plan": self._final_plan.to_dict(),
            "sample": {
                "seed": self._sample.seed,
                "fraction": self._sample.fraction,
                "sample_id": self._sample.sample_id,
            },
            "learning_rate_scale": self._extrapolation.learning_rate_scale,
            "learning_rate_key": self._extrapolation.learning_rate_key,
            "scores": self._scores,
            "final_trial_id": self._final_trial_id,
        }

    def _restore_extra(self, state: dict[str, Any]) -> None:
        super()._restore_extra(state)
        self._tuning_trials = int(state["tuning_trials"])
        self._final_plan = TrialSpend.from_dict(state["final_plan"])
        self._sample = TuningSample(**state["sample"])
        self._sample.keep()  # a restored search's interrupted tuning trials re-run before any new suggestion
        self._mechanism = SearchMechanism.subsampled_tuning(
            law=self._distribution,
            num_trials=self._tuning_trials,
            sample_rate=self._sample.fraction,
            final_plan=self._final_plan,
        )
        self._extrapolation = Extrapolation(state["learning_rate_scale"], state["learning_rate_key"])
        self._scores = state["scores"]
        self._final_trial_id = state["final_trial_id"]
