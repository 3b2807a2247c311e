"""DP Bayesian optimisation (Kusner et al. 2015): GP-UCB on a finite Λ, private final release.

Threat model (unlike the rest of the package): the training data are public and
the *validation* set is private. GP-UCB (Srinivas et al. 2010) explores freely over a
finite candidate set Λ; only the final release is differentially private:

* λ̃ ~ exponential mechanism on the posterior mean μ_T (Algorithm 1, Theorem 1);
* ṽ = the best observed gain + Laplace noise (Algorithm 1, Theorem 3; or
  Algorithm 3, Theorem 7, without the GP assumption).

The maths (β_t, c, C1, γ_T, the noise scales, and where it departs from the paper
towards more noise) lives in :mod:`ray_dptune.accounting.bounds.dpbo_bounds`.

The surrogate's hyperparameters are FIXED before any data: kernel (RBF or Matérn-5/2),
lengthscale ℓ on the unit-cube coordinates, k2(λ, λ) = 1, noise variance σ², prior mean
and std (a data-independent affine map of the metric). Fitting them to validation
scores would make the surrogate depend on the data outside Assumption 1's proof, so
nothing is fitted. Λ: grid_search/choice values form a cartesian product; numeric
domains contribute ``num_candidates`` scrambled-Sobol points (log scale for log
domains; :mod:`ray_dptune.search.candidates` maps them), drawn once, before any trial.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import numbers
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bounds import dpbo_bounds as vr
from ray_dptune.accounting.bounds.information_gain import KernelName
from ray_dptune.errors import PrivacyError, UnsupportedBoundError
from ray_dptune.extras import require_extra
from ray_dptune.search.base import PrivateSearcher
from ray_dptune.search.candidates import build_candidate_set
from ray_dptune.search.dpbo_settings import (
    DEFAULT_LENGTHSCALE,
    DEFAULT_NOISE_VARIANCE,
    DPBOSettings,
    release_constants,
)
from ray_dptune.search.gp import gp_posterior

require_extra(
    "dphypo", __name__
)  # BoTorch itself loads at the first GP posterior; a missing one fails here, before a search

__all__ = ["DPBOSearcher", "draw_index"]

logger = logging.getLogger(__name__)

MAX_FAILURES = 3  # failed attempts of one step before the search stops


def draw_index(probabilities: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn with ``probabilities`` (inverse CDF of one uniform from ``rng``)."""
    cdf = np.cumsum(probabilities)
    return min(int(np.searchsorted(cdf / cdf[-1], rng.random(), side="right")), cdf.size - 1)


class DPBOSearcher(PrivateSearcher):
    """Differentially private Bayesian optimisation (Kusner et al. 2015) for Ray Tune.

    Runs GP-UCB, λ_t = argmax_Λ μ_{t−1} + √β_t σ_{t−1} with β_t = 2 log(|Λ|t²π²/(3δ_β)),
    one trial at a time (``suggest`` returns None while one is pending), for T =
    ``num_trials`` completed trials, then releases privately and returns ``FINISHED``:

    * ``algorithm=1`` (Assumption 1, noisy observations): λ̃ by the exponential
      mechanism on μ_T with Δ = 2√β_{T+1} + c, c = 2√((1 − k1) log(3|Λ|/δ)) (Theorem 1),
      and/or ṽ = max_t v_t + Laplace (Theorem 3, union bound redone). Each is (ε, δ);
      both are (2ε, 2δ) by basic composition (Kusner, after Theorem 4).
    * ``algorithm=3`` (Assumption 2, no GP assumption): ṽ only, Laplace of scale
      ((λ_max − λ_min)L/(λ_maxλ_min) + g*/m)/ε (Theorem 7), ε-DP; λ = config[reg_key].
    * ``algorithm=2`` (noise-free, Theorem 5) raises UnsupportedBoundError: its
      constants are not computable (:func:`~ray_dptune.accounting.bounds.dpbo_bounds.algorithm2_laplace_scale`).

    The guarantee is Kusner's: it holds under the stated assumption, and δ includes
    the probability (over the GP prior and the observation noise) that the
    sensitivity bound fails. Only the release is private, not the T trials.

    The metric is the trial's last reported validation gain (report it once, when
    the model is final); ``mode="min"`` negates it. The draws (Λ's Sobol points, λ̃, ṽ) use a generator seeded from the OS's secure
    source unless ``seed`` is given. The trials need not report ``dp_plan``: the
    training data are public here. A failed trial is retried with the same λ_t
    (failures must not depend on the validation data); ``MAX_FAILURES`` in a row stop
    the search with PrivacyError.

    Args:
        num_trials: T ≥ 1.
        metric: the validation gain (or from ``tune.TuneConfig``).
        mode: 'max' or 'min' (or from ``tune.TuneConfig``).
        space: the Tune search space (or ``param_space`` of the Tuner).
        epsilon: ε > 0 of each release. delta: δ ∈ (0, 1) of each release (algorithm 1);
            None or 0 for algorithm 3.
        algorithm: 1 or 3 (2 raises). release: "both", "config" (λ̃) or "score" (ṽ).
        k1: k1(V, V') ∈ [0, 1], a lower bound over neighbouring validation sets (§6: 0.95).
        kernel: the fixed kernel k2.
        lengthscale: k2's lengthscale (GP units).
        noise_variance: σ² (GP units).
        prior_mean: with ``prior_std``, the fixed affine map (metric − prior_mean)/prior_std ~ GP(0, k2).
        prior_std: see ``prior_mean``.
        num_candidates: Sobol points for the numeric domains (per discrete combination).
        lipschitz: L, for algorithm 3.
        g_star: g*, for algorithm 3.
        validation_size: m, for algorithm 3.
        reg_key: the config key of λ (the L2 weight of eq. 10), for algorithm 3.
        seed: for tests and reproducibility; None draws from the OS's secure source.

    Example:
        >>> from ray import tune
        >>> from ray_dptune import PrivacyAccountantCallback, private_tune_config
        >>> space = {"C": tune.grid_search([0.1, 1.0, 10.0]), "gamma": tune.grid_search([1e-3, 1e-2])}
        >>> searcher = DPBOSearcher(12, metric="val_acc", mode="max", epsilon=1.0, delta=1e-3)
        >>> callback = PrivacyAccountantCallback(searcher, delta=2e-3)  # λ̃ and ṽ: (2ε, 2δ)
        >>> tuner = tune.Tuner(lambda config: tune.report({"val_acc": 0.9}), param_space=space,
        ...                    tune_config=private_tune_config(searcher),
        ...                    run_config=tune.RunConfig(callbacks=[callback]))
    """

    threat_model = (
        "validation set: the training data are public; GP-UCB explores freely and only the final release "
        "(λ̃ by the exponential mechanism, ṽ with Laplace noise) is differentially private with respect to "
        "swapping one validation record, under the assumption stated with the guarantee (Kusner et al. 2015)"
    )
    coverage = (
        "The guarantee covers the searcher's own release only: details['release'] = {config: λ̃, score: ṽ} "
        "(None for a part not released). The T configurations GP-UCB tried and their validation scores depend on "
        "the validation set and are NOT covered: Ray keeps them on disk and this report withholds them "
        "(release_best(..., purge=True) deletes the trials' folders). No "
        "checkpoint is released: retrain with λ̃ on the public training data."
    )
    configs_public = False  # GP-UCB picks them from raw validation scores
    needs_metric = True

    def __init__(
        self,
        num_trials: int,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        *,
        epsilon: float,
        delta: float | None = None,
        algorithm: Literal[1, 2, 3] = 1,
        release: vr.Release = "both",
        k1: float = vr.DEFAULT_K1,
        kernel: KernelName = "matern52",
        lengthscale: float = DEFAULT_LENGTHSCALE,
        noise_variance: float = DEFAULT_NOISE_VARIANCE,
        prior_mean: float = 0.0,
        prior_std: float = 1.0,
        num_candidates: int = 64,
        lipschitz: float | None = None,
        g_star: float | None = None,
        validation_size: int | None = None,
        reg_key: str | None = None,
        seed: int | None = None,
    ):
        if isinstance(num_trials, bool) or not isinstance(num_trials, numbers.Integral) or num_trials < 1:
            raise ValueError(f"num_trials = T must be an int >= 1, got {num_trials!r}.")
        settings = DPBOSettings(
            epsilon=epsilon,
            delta=delta,
            algorithm=algorithm,
            release=release,
            k1=k1,
            kernel=kernel,
            lengthscale=lengthscale,
            noise_variance=noise_variance,
            prior_mean=prior_mean,
            prior_std=prior_std,
            num_candidates=num_candidates,
            lipschitz=lipschitz,
            g_star=g_star,
            validation_size=validation_size,
            reg_key=reg_key,
        )
        super().__init__(metric=metric, mode=mode, seed=seed)
        self._settings: DPBOSettings = settings
        self._num_trials = int(num_trials)
        self._configs: list[dict[str, Any]] = []
        self._features: np.ndarray = np.zeros((0, 0))
        self._observations: list[tuple[int, float]] = []  # (index in Λ, metric as reported)
        self._pending: str | None = None
        self._retry: int | None = None
        self._failures: int = 0
        self._bounds: dict[str, Any] | None = None
        self._release: dict[str, Any] | None = None
        if space is not None:
            self._set_space(space)

    # ------------------------------------------------------------------ what the accountant reads
    def accounts_trial(self, config: Mapping[str, Any]) -> bool:
        """False: the training data are public here, so trials report no DP-SGD plan."""
        return False

    def privacy_mechanism(self) -> SearchMechanism:
        """The release's (ε, δ) (Kusner et al. 2015), charged once per release the search makes."""
        guarantee = self.release_guarantee()
        return SearchMechanism.release(epsilon=guarantee["epsilon"], delta=guarantee["delta"], description=guarantee)

    def release_guarantee(self) -> dict[str, Any]:
        """(ε, δ) of the release, with its assumption, known before the search starts."""
        return self._settings.guarantee()

    def privacy_details(self) -> dict[str, Any]:
        """|Λ|, T, the constants of the release (GP and metric units) and, at the end, the release."""
        details: dict[str, Any] = {
            "algorithm": self._settings.algorithm,
            "num_trials": self._num_trials,
            "num_candidates": len(self._configs) or None,
            "trials_completed": len(self._observations),
            "settings": self._settings.to_dict(),
            "release": self._release,
        }
        if self._space is not None:
            details.update(self._constants())
        return details

    # ------------------------------------------------------------------ Searcher API
    def _done(self) -> bool:
        return self._release is not None or len(self._observations) >= self._num_trials

    def _propose(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        if self._pending is not None:
            return None  # one trial at a time: GP-UCB's λ_t needs every earlier observation
        if self._retry is not None:
            if self._failures >= MAX_FAILURES:
                raise PrivacyError(
                    f"The trial for step {len(self._observations) + 1} failed {self._failures} times; DP-BO's "
                    "guarantee needs an observation for each of the T steps, so the search stops without a release."
                )
            index = self._retry
        else:
            index = self.next_index()
        self._pending = trial_id
        return copy.deepcopy(self._configs[index]), {"index": index, "status": "pending"}

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Records the observation; after the T-th, makes the private release. A repeat call is ignored."""
        record = self._suggested.get(trial_id)
        if record is None or record["status"] != "pending":
            return
        assert self._metric is not None  # suggest() refuses without a metric (needs_metric)
        self._pending = None
        score = None if error or not result else result.get(self._metric)
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(score):
            record["status"] = "failed"
            self._retry, self._failures = record["index"], self._failures + 1
            logger.warning(
                "Trial %s gave no finite %r; step %d is retried.", trial_id, self._metric, len(self._observations) + 1
            )
            return
        record["status"] = "completed"
        self._retry, self._failures = None, 0
        self._observations.append((record["index"], float(score)))
        if len(self._observations) == self._num_trials:
            self.record_event({"type": "release"})  # charged before it exists: a restore cannot release twice unseen
            self._release = self._make_release()

    def _extra_state(self) -> dict[str, Any]:
        return {
            "settings": self._settings,
            "configs": self._configs,
            "features": self._features,
            "observations": self._observations,
            "pending": self._pending,
            "retry": self._retry,
            "failures": self._failures,
            "release": self._release,
        }

    def _restore_extra(self, state: dict[str, Any]) -> None:
        self._settings, self._configs, self._features = state["settings"], state["configs"], state["features"]
        self._observations = [(index, value) for index, value in state["observations"]]
        self._pending, self._retry, self._failures = state["pending"], state["retry"], int(state["failures"])
        self._release, self._bounds = state["release"], None

    # ------------------------------------------------------------------ GP-UCB and the release
    @property
    def candidates(self) -> list[dict[str, Any]]:
        """Λ, the configurations GP-UCB chooses from (empty before the space is known)."""
        return [copy.deepcopy(c) for c in self._configs]

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """(μ_t, σ_t) over Λ in GP units after the t observations so far."""
        s = self._settings
        x = self._features[[i for i, _ in self._observations]]
        return gp_posterior(
            x,
            self._gp_values(),
            self._features,
            kernel=s.kernel,
            lengthscale=s.lengthscale,
            noise_variance=s.noise_variance,
        )

    def next_index(self) -> int:
        """Index in Λ of GP-UCB's λ_t = argmax μ_{t−1} + √β_t σ_{t−1} (first index on ties)."""
        mean, std = self.posterior()
        t = len(self._observations) + 1
        return int(np.argmax(mean + math.sqrt(vr.beta_t(t, len(self._configs), delta=self._settings.delta_beta)) * std))

    def release_probabilities(self) -> np.ndarray:
        """The exponential mechanism's law of λ̃ over Λ: softmax(ε μ_t / (2Δ)) (algorithm 1)."""
        if self._settings.algorithm != 1:
            raise UnsupportedBoundError("Only algorithm 1 releases a configuration (Kusner et al. Theorem 1).")
        mean, _ = self.posterior()
        sensitivity = self._constants()["em_sensitivity"]
        return vr.exponential_mechanism_probabilities(mean, epsilon=self._settings.epsilon, sensitivity=sensitivity)

    def _sign(self) -> float:
        return -1.0 if self._mode == "min" else 1.0

    def _gp_values(self) -> np.ndarray:
        """Observations in GP units: sign·(metric − prior_mean)/prior_std."""
        s = self._settings
        raw = np.array([v for _, v in self._observations], dtype=float)
        values: np.ndarray = self._sign() * (raw - s.prior_mean) / s.prior_std
        return values

    def _constants(self) -> dict[str, Any]:
        if self._bounds is None:
            self._bounds = release_constants(self._settings, self._configs, self._features, self._num_trials)
        return dict(self._bounds)

    def _make_release(self) -> dict[str, Any]:
        """λ̃ and/or ṽ, drawn once from the searcher's generator after the T-th observation."""
        s, bounds, sign = self._settings, self._constants(), self._sign()
        release: dict[str, Any] = {"config": None, "score": None, "index": None}
        if s.release in ("both", "config"):
            index = draw_index(self.release_probabilities(), self._rng)
            release["config"], release["index"] = copy.deepcopy(self._configs[index]), index
        if s.release in ("both", "score"):
            if s.algorithm == 1:
                best = float(self._gp_values().max())  # v* in GP units
                noisy = best + self._rng.laplace(0.0, bounds["laplace_scale"])
                release["score"] = s.prior_mean + sign * s.prior_std * noisy
            else:
                best = float(max(sign * v for _, v in self._observations))
                release["score"] = sign * (best + self._rng.laplace(0.0, bounds["laplace_scale"]))
        return release

    def _set_space(self, space: dict[str, Any]) -> None:
        configs, features = build_candidate_set(space, self._rng, self._settings.num_candidates)
        if self._settings.algorithm == 3:
            assert self._settings.reg_key is not None  # DPBOSettings requires it for algorithm 3
            _check_regularisation_only(configs, self._settings.reg_key)
        super()._set_space(space)
        self._configs, self._features, self._bounds = configs, features, None


def _check_regularisation_only(configs: list[dict[str, Any]], key: str) -> None:
    """Algorithm 3 (Theorem 7) covers only the L2 weight λ > 0: every other value must be constant."""
    if any(key not in c for c in configs):
        raise ValueError(f"reg_key {key!r} is not a key of the search space.")
    values = [c[key] for c in configs]
    if any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v > 0) for v in values):  # type: ignore[operator]  # numbers.Real's stub lacks __gt__
        raise ValueError(f"Every value of {key!r} must be a finite L2 weight λ > 0 (Kusner eq. 10).")
    rest = {json.dumps({k: v for k, v in c.items() if k != key}, sort_keys=True, default=repr) for c in configs}
    if len(rest) > 1:
        raise UnsupportedBoundError(
            f"Algorithm 3's bound (Kusner et al. Theorem 7) covers only the L2 weight {key!r}; another "
            "hyperparameter varies over the space, which no proven bound covers. Fix the others."
        )
