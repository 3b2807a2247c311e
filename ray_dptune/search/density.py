"""DP-HyPO's adaptive law on a fixed set of cells (Wang et al. 2023, arXiv:2306.05734v2, §3.2, App. D).

:class:`BoundedDensitySampler` turns observed scores into per-cell sampling
probabilities q with c·π₀ ≤ q ≤ C·π₀: a GP surrogate's UCB scores (μ + τσ),
standardised under the prior, through a softmax of inverse temperature β, then the
exact ℓ2 projection onto S_{C,c}(π₀)
(:func:`~ray_dptune.search.projection.project_to_bounded_density`), checked in every
cell before each draw. :mod:`ray_dptune.search.dphypo` runs it as a Tune searcher.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from ray_dptune.accounting.bounds.distributions import secure_rng
from ray_dptune.errors import PrivacyError
from ray_dptune.extras import extra_imports
from ray_dptune.search.gp import single_thread
from ray_dptune.search.projection import project_to_bounded_density

__all__ = [
    "DEFAULT_BETA",
    "DEFAULT_LOWER",
    "DEFAULT_TAU",
    "DEFAULT_UPPER",
    "BoundedDensitySampler",
    "check_bounds",
    "check_non_negative",
]

logger = logging.getLogger(__name__)

DEFAULT_UPPER = 1.5  # C: at equal total ε, C/c = 2 ties uniform on digits and C = 3 loses (dphypo_frontier.md)
DEFAULT_LOWER = 0.75  # c
DEFAULT_BETA = 3.0  # softmax inverse temperature on standardised UCB scores (benchmarks/results/dphypo_frontier.md)
DEFAULT_TAU = 0.1  # UCB exploration weight (DP-HyPO App. E)
MARGIN = 1e-9  # relative tightening of [c, C] so that rounding cannot leave the bounds
MIN_CELL_PRIOR = 2.0**-53 / MARGIN  # below this a 53-bit uniform cannot resolve the margin


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
        upper: float = DEFAULT_UPPER,
        lower: float = DEFAULT_LOWER,
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
        self.beta, self.tau = check_non_negative("beta", beta), check_non_negative("tau", tau)
        self.rng = secure_rng(rng)
        self.warm_iterations = int(warm_iterations)
        self.fit_failures = 0
        self._hyperparameters: dict[str, np.ndarray] | None = None  # warm start of the next fit

    # ------------------------------------------------------------------ the pipeline
    def probabilities(self, candidates: np.ndarray, observed_x: np.ndarray, observed_y: np.ndarray) -> np.ndarray:
        """Per-cell sampling probabilities after ``observed`` results, checked to lie in [c, C]·prior.

        Args:
            candidates: (n, k) surrogate inputs of the cells' representative points, in [0, 1].
            observed_x: (m, k) inputs of completed trials.
            observed_y: (m,) their scores (higher is better).

        Returns:
            q, one probability per cell.
        """
        if self.upper == self.lower == 1.0 or self.prior.size == 1:
            prior: np.ndarray = self.prior.copy()  # S_{1,1} = {prior}: no model needed
            return prior
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
            with extra_imports("dphypo", "ray_dptune.search.density"):
                from botorch.exceptions.errors import ModelFittingError
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
        relative: np.ndarray = p / (self.prior * p).sum()
        return relative

    def project(self, density: np.ndarray) -> np.ndarray:
        """The ℓ2 projection onto S_{C,c}(prior) with bounds tightened by ``MARGIN``, as probabilities."""
        upper = self.upper * (1.0 - MARGIN) if self.upper > 1.0 else 1.0
        lower = self.lower * (1.0 + MARGIN) if self.lower < 1.0 else 1.0
        f = project_to_bounded_density(density, np.ones_like(self.prior), self.prior, upper, lower)
        q = self.prior * f
        # Σ prior·f = 1 to ~ulp(max p); the margin absorbs the rescaling, check() verifies
        probabilities: np.ndarray = q / q.sum()
        return probabilities

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
        with extra_imports("dphypo", "ray_dptune.search.density"):
            import torch
            from botorch.acquisition.analytic import UpperConfidenceBound
            from botorch.fit import fit_gpytorch_mll
            from botorch.models import SingleTaskGP
            from gpytorch.mlls import ExactMarginalLogLikelihood

        with single_thread(torch), torch.random.fork_rng(devices=[]):
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
        scores: np.ndarray = ucb.numpy().astype(float)
        return scores


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


def check_non_negative(name: str, value: float) -> float:
    """``value`` as a float, or ValueError naming ``name`` unless it is finite and >= 0."""
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}.")
    return value
