"""DP-HyPO with a Gaussian process (Wang et al. 2023, arXiv:2306.05734v2, Algorithm 3).

Privacy argument, in brief. DP-HyPO Framework 1 runs T ~ NegBin(η, γ) trials and
releases the best; the sampling law of every trial may depend on earlier results
as long as its density stays within [c, C] times the prior's. Theorem 1 then
bounds the whole search by the base mechanism's RDP plus terms in log(C/c)
(App. D extends it to an informed prior π₀). This module keeps that condition
by construction and checks it before every draw:

1. a GP surrogate scores every cell of a partition of the space (UCB μ + τσ),
2. a softmax turns the scores into a density relative to the prior,
3. the exact ℓ2 projection onto S_{C,c}(π₀) (§3.2,
   :func:`~ray_dptune.search.projection.project_to_bounded_density`) bounds it,
4. :meth:`BoundedDensitySampler.check` raises :class:`~ray_dptune.errors.PrivacyError`
   unless c·π₀ ≤ q ≤ C·π₀ holds in every cell, then a cell is drawn and a point
   uniformly inside it (:mod:`ray_dptune.search.candidates`), so the density
   ratio is the cell's ratio at every point of the space.

The accountant callback reads ``density_ratio = C/c`` and composes
``repeat_and_select(plan, law, density_ratio=C/c)`` (DP-HyPO Theorem 1).

Defaults. The paper's β = 1 on raw accuracies (App. E) leaves the softmax nearly
uniform. Here UCB scores are standardised under the prior first, so β means the
same on every metric's scale; β = 1 (``DEFAULT_BETA``) puts the best cells at C
and the worst at c once the GP separates them. A larger β adapts *less*: the ℓ2
projection of a very peaked softmax gives C to a few top cells and leaves the
rest near the prior (benchmarks/results/dphypo_latency.md, "β sweep").
τ = 0.1 is the paper's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
from collections.abc import Iterator
from typing import Any

import numpy as np
from ray.tune.search import Searcher

from ray_dptune.distributions import (
    PointMass,
    RunCountDistribution,
    TruncatedNegativeBinomial,
    distribution_from_dict,
    secure_rng,
)
from ray_dptune.errors import PrivacyError, UnsupportedBoundError
from ray_dptune.search.base import RunCountSearcher
from ray_dptune.search.candidates import SearchCells, build_cells
from ray_dptune.search.projection import project_to_bounded_density

__all__ = ["DEFAULT_BETA", "DEFAULT_TAU", "BoundedDensitySampler", "DPHyPOSearcher"]

logger = logging.getLogger(__name__)

DEFAULT_BETA = 1.0  # softmax inverse temperature on standardised UCB scores
DEFAULT_TAU = 0.1  # UCB exploration weight (DP-HyPO App. E)
MARGIN = 1e-9  # relative tightening of [c, C] so that rounding cannot leave the bounds
MIN_CELL_PRIOR = 2.0**-53 / MARGIN  # below this a 53-bit uniform cannot resolve the margin

_NO_SPACE = "DPHyPOSearcher has no search space: pass `space=` to it or `param_space=` to tune.Tuner."
_NO_METRIC = (
    "DPHyPOSearcher needs a metric and a mode ('max' or 'min') to adapt: pass them to it or to tune.TuneConfig."
)


class BoundedDensitySampler:
    """Algorithm 3's adaptive law on a fixed set of cells, without Ray.

    Holds the prior masses of n cells and turns observations into per-cell
    sampling probabilities q with c·prior ≤ q ≤ C·prior (DP-HyPO §3.2, App. D).
    It maximises y: pass -y to minimise. With C = c = 1 it returns the prior
    itself (uniform random search).

    Args:
        prior_probs: π₀ mass of each cell (positive, sums to 1).
        upper: C ≥ 1. lower: c in (0, 1].
        beta: softmax inverse temperature on standardised UCB scores (≥ 0).
        tau: UCB weight of the posterior standard deviation (≥ 0).
        rng: the generator for draws (a seed, a Generator, or None for the OS's secure source).
        warm_iterations: cap on L-BFGS-B iterations of a GP fit that starts from the
            previous fit's hyperparameters (the first fit runs to convergence); a fit
            the cap stops early is continued by the next one.

    Example:
        >>> sampler = BoundedDensitySampler(np.full(4, 0.25), upper=2.0, lower=0.75, rng=0)
        >>> x = np.array([[0.1], [0.4], [0.6], [0.9]])
        >>> q = sampler.probabilities(x, x[:3], np.array([0.0, 1.0, 0.2]))
        >>> cell = sampler.draw(q)
    """

    def __init__(
        self,
        prior_probs: np.ndarray,
        *,
        upper: float = 2.0,
        lower: float = 0.75,
        beta: float = DEFAULT_BETA,
        tau: float = DEFAULT_TAU,
        rng: np.random.Generator | int | None = None,
        warm_iterations: int = 20,
    ):
        self.upper, self.lower = check_bounds(upper, lower)
        prior = np.asarray(prior_probs, dtype=float)
        if prior.ndim != 1 or prior.size == 0 or not np.all(prior > 0) or not np.isclose(prior.sum(), 1.0, 0, 1e-9):
            raise ValueError("prior_probs must be a 1-D array of positive cell masses summing to 1.")
        if prior.min() < MIN_CELL_PRIOR:
            raise ValueError(f"A cell of prior mass {prior.min():.3g} is too small for an exact draw; use fewer cells.")
        self.prior = prior
        self.beta, self.tau = _non_negative("beta", beta), _non_negative("tau", tau)
        self.rng = secure_rng(rng)
        self.warm_iterations = int(warm_iterations)
        self.fit_failures = 0
        self._hyperparameters: dict[str, np.ndarray] | None = None  # warm start of the next fit

    # ------------------------------------------------------------------ the pipeline
    def probabilities(self, candidates: np.ndarray, observed_x: np.ndarray, observed_y: np.ndarray) -> np.ndarray:
        """Per-cell sampling probabilities after ``observed`` results, checked to lie in [c, C]·prior.

        Args:
            candidates: (n, k) surrogate inputs of the cells' representative points, in [0, 1].
            observed_x: (m, k) inputs of completed trials. observed_y: (m,) their scores (higher is better).

        Returns:
            q, one probability per cell.
        """
        if self.upper == self.lower == 1.0 or self.prior.size == 1:
            return self.prior.copy()  # S_{1,1} = {prior}: no model needed
        p = self.density(self.scores(candidates, observed_x, observed_y))
        q = self.prior.copy() if np.all(p == 1.0) else self.project(p)  # the prior is in S_{C,c}: keep it exact
        self.check(q)
        return q

    def scores(self, candidates: np.ndarray, observed_x: np.ndarray, observed_y: np.ndarray) -> np.ndarray | None:
        """UCB μ + τσ of a GP fitted to the observations, or None (use the prior).

        None with fewer than 2 distinct scores, or when fitting fails (the prior
        lies in S_{C,c}, so privacy holds either way).
        """
        x, y = np.asarray(observed_x, dtype=float), np.asarray(observed_y, dtype=float).reshape(-1)
        finite = np.isfinite(y)
        x, y = x[finite], y[finite]
        if y.size < 2 or np.ptp(y) == 0.0:
            return None
        try:
            return self._ucb(np.asarray(candidates, dtype=float), x, y)
        except Exception as error:
            from botorch.exceptions import ModelFittingError
            from linear_operator.utils.errors import NanError, NotPSDError

            if not isinstance(error, (ModelFittingError, NotPSDError, NanError, RuntimeError, ValueError)):
                raise
            self.fit_failures += 1
            logger.warning("GP fit failed (%s); this draw uses the prior, which is inside S_(C,c).", error)
            return None

    def density(self, scores: np.ndarray | None) -> np.ndarray:
        """Softmax of standardised scores as a density relative to the prior (Σ prior·p = 1).

        Scores are centred and scaled by their mean and standard deviation under
        the prior, so β has one meaning on every metric's scale; equal scores
        (or none) give the prior itself.
        """
        if scores is None:
            return np.ones_like(self.prior)
        s = np.asarray(scores, dtype=float)
        if not np.all(np.isfinite(s)):
            return np.ones_like(self.prior)
        mean = (self.prior * s).sum()  # standardised under the prior: the partition does not matter
        spread = math.sqrt((self.prior * (s - mean) ** 2).sum())
        if spread <= 1e-12 * max(1.0, abs(mean)):
            return np.ones_like(self.prior)
        logits = self.beta * (s - mean) / spread
        p = np.exp(logits - logits.max())
        return p / (self.prior * p).sum()

    def project(self, density: np.ndarray) -> np.ndarray:
        """The ℓ2 projection onto S_{C,c}(prior) with bounds tightened by ``MARGIN``, as probabilities."""
        upper = self.upper * (1.0 - MARGIN) if self.upper > 1.0 else 1.0
        lower = self.lower * (1.0 + MARGIN) if self.lower < 1.0 else 1.0
        f = project_to_bounded_density(density, np.ones_like(self.prior), self.prior, upper, lower)
        q = self.prior * f
        return q / q.sum()  # Σ prior·f = 1 to ~ulp(max p); the margin absorbs the rescaling, check() verifies

    def check(self, q: np.ndarray) -> None:
        """Raises PrivacyError unless c·prior ≤ q ≤ C·prior in every cell (exact) and Σq = 1 (to 1e-12)."""
        q = np.asarray(q, dtype=float)
        if q.shape != self.prior.shape or not np.all(np.isfinite(q)):
            raise PrivacyError("The sampling probabilities are malformed; refusing to draw.")
        low, high = q < self.lower * self.prior, q > self.upper * self.prior
        if low.any() or high.any() or abs(q.sum() - 1.0) > 1e-12:
            ratio = q / self.prior
            raise PrivacyError(
                f"The adaptive sampling law leaves [c, C] = [{self.lower}, {self.upper}] times the prior "
                f"(ratios {ratio.min():.6g} to {ratio.max():.6g}, total {q.sum():.15g}); DP-HyPO Theorem 1 would "
                "not hold, so no trial is drawn."
            )

    def draw(self, q: np.ndarray) -> int:
        """Checks ``q`` (:meth:`check`), then draws one cell index with those probabilities."""
        self.check(q)
        cdf = np.cumsum(q)
        cdf /= cdf[-1]
        return int(np.searchsorted(cdf, self.rng.random(), side="right"))

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        """The generator's state and the GP warm start (enough to continue identically)."""
        return {"rng_state": self.rng.bit_generator.state, "hyperparameters": self._hyperparameters}

    def set_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`get_state`."""
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng_state"]
        self._hyperparameters = state["hyperparameters"]

    # ------------------------------------------------------------------ surrogate
    def _ucb(self, candidates: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        import torch
        from botorch.acquisition.analytic import UpperConfidenceBound
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from gpytorch.mlls import ExactMarginalLogLikelihood

        with _single_thread(torch), torch.random.fork_rng(devices=[]):
            torch.manual_seed(y.size)  # fit retries resample from priors: keep them reproducible
            model = SingleTaskGP(torch.as_tensor(x), torch.as_tensor(y).unsqueeze(-1))
            shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            warm = self._hyperparameters or {}
            options = {}
            if warm and all(shapes.get(k) == tuple(np.shape(v)) for k, v in warm.items()):  # warm start
                model.load_state_dict({k: torch.as_tensor(v) for k, v in warm.items()}, strict=False)
                options = {"maxiter": self.warm_iterations}
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
            fit_gpytorch_mll(mll, optimizer_kwargs={"options": options})
            self._hyperparameters = {
                k: v.detach().numpy().copy()
                for k, v in model.state_dict().items()
                if not k.startswith("outcome_transform")
            }
            with torch.no_grad():  # UCB's β is τ² (μ + √β σ); t-batch: one q=1 posterior per cell
                ucb = UpperConfidenceBound(model, beta=self.tau**2)(torch.as_tensor(candidates).unsqueeze(-2))
        return ucb.numpy().astype(float)


@contextlib.contextmanager
def _single_thread(torch: Any) -> Iterator[None]:
    """Small GP algebra runs fastest on one thread (and 10× slower when a busy machine's threads contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def check_bounds(upper: float, lower: float) -> tuple[float, float]:
    """Validates C ≥ 1 ≥ c > 0 (DP-HyPO §3.2: S_{C,c} holds densities only then)."""
    upper, lower = float(upper), float(lower)
    if not math.isfinite(upper) or upper < 1.0:
        raise ValueError(f"upper = C must be a finite number >= 1 (C < 1 leaves no density), got {upper}.")
    if not math.isfinite(lower) or lower > 1.0:
        raise ValueError(f"lower = c must be <= 1 (c > 1 leaves no density), got {lower}.")
    if lower <= 0.0:
        raise ValueError(f"lower = c must be > 0 (c <= 0 makes C/c, the privacy cost, unbounded), got {lower}.")
    return upper, lower


def _non_negative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}.")
    return value


class DPHyPOSearcher(RunCountSearcher):
    """DP-HyPO with a Gaussian process (Wang et al. 2023, Algorithm 3) for Ray Tune.

    T ~ ``distribution`` is drawn once, when the searcher is built, from the OS's
    secure source (or ``seed``) and never again; ``save``/``restore`` carry it
    with the generator, the space, metric, mode, cells, observations and the GP
    warm start. Each suggestion draws a cell with probability q_i, where
    c·π₀_i ≤ q_i ≤ C·π₀_i is checked before the draw, then a point uniformly
    inside it (:mod:`ray_dptune.search.candidates`). Pending trials are ignored:
    with ``max_concurrent_trials > 1`` each suggestion uses the trials completed
    so far. With C = c = 1 this is uniform random search.

    Which trials have completed when a suggestion is made then depends on run
    times. The bound holds whatever that subset is, as long as run times do not
    depend on the private data; if they might, run one trial at a time.

    Privacy: DP-HyPO Theorem 1 with density ratio C/c, computed by
    :class:`ray_dptune.PrivacyAccountantCallback` from ``density_ratio``; the
    report shows the adaptivity's cost as ``epsilon_adaptivity``.

    Args:
        distribution: law of T, a :class:`TruncatedNegativeBinomial` (Theorem 1)
            or a :class:`PointMass` (composition); others raise UnsupportedBoundError.
        metric, mode: the score and 'max'/'min' (or from ``tune.TuneConfig``).
        space: the Tune search space (or ``param_space`` of the Tuner).
        upper: C ≥ 1. lower: c in (0, 1]. The paper uses C = 2, c = 0.75.
        beta: softmax inverse temperature on standardised UCB scores.
        tau: UCB exploration weight.
        candidates: the most cells in total. None: a grid of 50 per numeric axis
            (at most 2 500 cells with the discrete combinations) for ≤ 2 numeric
            axes, else 2 048 Sobol k-d cells per discrete combination (fewer when
            that passes 2 500). An int N: a grid of ⌊(N/n_disc)^(1/d)⌋ per axis,
            or N // n_disc Sobol cells (see :mod:`ray_dptune.search.candidates`).
        seed: for tests and reproducibility; None draws from the OS's secure source.

    Example:
        >>> from ray import tune
        >>> from ray_dptune import TruncatedNegativeBinomial, private_tune_config
        >>> law = TruncatedNegativeBinomial.from_mean(eta=0.5, mean=8)
        >>> searcher = DPHyPOSearcher(law, metric="val_acc", mode="max", upper=2.0, lower=0.75)
        >>> config = private_tune_config(searcher, max_concurrent_trials=2)
    """

    configs_public = False  # each draw's density depends on earlier trials' unreleased scores
    coverage = (
        "The guarantee covers the released output only: the selected (best) trial's configuration, score and "
        "checkpoint, as returned by ray_dptune.release_best. The other trials' configurations were drawn from "
        "densities fitted to unreleased scores: this report withholds them, and Ray's copies on disk are not "
        "covered (release_best(..., purge=True) deletes the trials' folders)."
    )

    def __init__(
        self,
        distribution: RunCountDistribution,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        *,
        upper: float = 2.0,
        lower: float = 0.75,
        beta: float = DEFAULT_BETA,
        tau: float = DEFAULT_TAU,
        candidates: int | None = None,
        seed: int | None = None,
    ):
        if not isinstance(distribution, (TruncatedNegativeBinomial, PointMass)):
            raise UnsupportedBoundError(
                f"DP-HyPO needs T ~ TruncatedNegativeBinomial (Theorem 1) or PointMass, got "
                f"{type(distribution).__name__}; no proven bound covers adaptive sampling with it."
            )
        if mode not in (None, "max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
        super().__init__(metric=metric, mode=mode)
        check_bounds(upper, lower)
        beta, tau = _non_negative("beta", beta), _non_negative("tau", tau)
        if candidates is not None and (
            isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1
        ):
            raise ValueError(f"candidates must be a positive int (the most cells) or None, got {candidates!r}.")
        self._distribution, self._seed, self._budget = distribution, seed, candidates
        self._settings = {"upper": float(upper), "lower": float(lower), "beta": beta, "tau": tau}
        rng = secure_rng(seed)
        self._num_trials = distribution.sample(rng)
        self._rng = rng
        self._space: dict | None = None
        self._cells: SearchCells | None = None
        self._sampler: BoundedDensitySampler | None = None
        self._suggested: dict[str, dict[str, Any]] = {}
        self._observations: list[tuple[np.ndarray, float]] = []
        self._cache: tuple[int, np.ndarray] | None = None
        if space is not None:
            self._set_space(space)

    # ------------------------------------------------------------------ what the accountant reads

    @property
    def density_ratio(self) -> float:
        """C/c: the bound on the adaptive density's ratio to the prior (DP-HyPO Theorem 1)."""
        return self._settings["upper"] / self._settings["lower"]

    @property
    def cells(self) -> SearchCells | None:
        """The partition of the space the sampling law lives on (None before the space is known)."""
        return self._cells

    def next_probabilities(self) -> np.ndarray:
        """Per-cell probabilities of the next draw, from the trials completed so far (cached)."""
        if self._sampler is None:
            raise RuntimeError(_NO_SPACE)
        if self._cache is None or self._cache[0] != len(self._observations):
            width = self._cells.features.shape[1]
            x = np.array([obs[0] for obs in self._observations], dtype=float).reshape(-1, width)
            y = np.array([obs[1] for obs in self._observations]) * (-1.0 if self._mode == "min" else 1.0)
            self._cache = (len(self._observations), self._sampler.probabilities(self._cells.features, x, y))
        return self._cache[1]

    # ------------------------------------------------------------------ Searcher API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        self.offer_space(config)
        self._metric = self._metric or metric  # needed to adapt, also when the space came with the searcher
        self._mode = self._mode or mode
        if self._space is not None:
            return False
        self._set_space(config)
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if len(self._suggested) >= self._num_trials:
            return Searcher.FINISHED
        if self._space is None:
            raise RuntimeError(_NO_SPACE)
        if self._metric is None or self._mode not in ("max", "min"):
            raise ValueError(_NO_METRIC)
        cell = self._sampler.draw(self.next_probabilities())  # checks [c, C]·prior first
        config, features = self._cells.sample(cell, self._sampler.rng)
        self._suggested[trial_id] = {"config": config, "x": features, "completed": False}
        self.record_suggestion(trial_id, config)
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Records the trial's score (if any) for the next draws; a second call is ignored."""
        record = self._suggested.get(trial_id)
        if record is None or record["completed"]:
            return
        record["completed"] = True
        score = None if error or not result else result.get(self._metric)
        if isinstance(score, numbers.Real) and not isinstance(score, bool) and math.isfinite(score):
            self._observations.append((record["x"], float(score)))
        else:
            logger.info("Trial %s finished without a finite %r; it does not inform the search.", trial_id, self._metric)

    def get_state(self) -> dict[str, Any]:
        return {
            "version": 1,
            "distribution": self._distribution.to_dict(),
            "num_trials": self._num_trials,
            "seed": self._seed,
            "settings": self._settings,
            "budget": self._budget,
            "rng_state": (self._sampler.rng if self._sampler else self._rng).bit_generator.state,
            "sampler": self._sampler.get_state() if self._sampler else None,
            "space": self._space,
            "cells": self._cells.to_state() if self._cells else None,
            "metric": self._metric,
            "mode": self._mode,
            "suggested": self._suggested,
            "observations": self._observations,
            "cache": self._cache,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1:
            raise ValueError(f"Unknown DPHyPOSearcher state version {state.get('version')!r}.")
        self._distribution = distribution_from_dict(state["distribution"])
        self._num_trials = int(state["num_trials"])
        self._seed, self._settings, self._budget = state["seed"], dict(state["settings"]), state["budget"]
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng_state"]
        self.check_restored_space(state["space"])
        self._space, self._metric, self._mode = state["space"], state["metric"], state["mode"]
        self._cells = SearchCells.from_state(self._space, state["cells"]) if state["cells"] else None
        self._sampler = self._new_sampler() if self._cells else None
        if self._sampler is not None:
            self._sampler.set_state(state["sampler"])
            self._rng = self._sampler.rng  # one generator for T, the cells and every draw
        self._suggested = {k: dict(v) for k, v in state["suggested"].items()}
        self._observations = list(state["observations"])
        self._cache = state["cache"]

    # ------------------------------------------------------------------ helpers
    def _set_space(self, space: dict[str, Any]) -> None:
        self._cells = build_cells(space, self._rng, self._budget)
        self._space = space
        self._sampler = self._new_sampler()

    def _new_sampler(self) -> BoundedDensitySampler:
        return BoundedDensitySampler(self._cells.prior, rng=self._rng, **self._settings)
