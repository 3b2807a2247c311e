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
same on every metric's scale. C = 1.5, c = 0.75, β = 3 (``DEFAULT_UPPER``,
``DEFAULT_LOWER``, ``DEFAULT_BETA``) come from the frontier at equal total ε
(benchmarks/results/dphypo_frontier.md): they tie uniform search on digits and do
not lose anywhere measured, where C = 3 loses. A larger β gives C to fewer top cells
and leaves the rest near the prior (dphypo_latency.md, "β sweep"). τ = 0.1 is the paper's.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any, TypedDict

import numpy as np

from ray_dptune.accounting.bounds.distributions import PointMass, RunCountDistribution, TruncatedNegativeBinomial
from ray_dptune.errors import UnsupportedBoundError
from ray_dptune.extras import require_extra
from ray_dptune.search.base import RunCountSearcher
from ray_dptune.search.candidates import SearchCells, build_cells
from ray_dptune.search.density import (
    DEFAULT_BETA,
    DEFAULT_LOWER,
    DEFAULT_TAU,
    DEFAULT_UPPER,
    BoundedDensitySampler,
    check_bounds,
    check_non_negative,
)

require_extra("dphypo", __name__)  # BoTorch itself loads at the first GP fit; a missing one fails here, before a search

__all__ = ["DPHyPOSearcher"]

logger = logging.getLogger(__name__)


class _Settings(TypedDict):
    upper: float
    lower: float
    beta: float
    tau: float


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
        metric: the score (or from ``tune.TuneConfig``).
        mode: 'max' or 'min' (or from ``tune.TuneConfig``).
        space: the Tune search space (or ``param_space`` of the Tuner).
        upper: C ≥ 1 (default 1.5). lower: c in (0, 1] (default 0.75). The paper uses C = 2, c = 0.75.
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

    needs_metric = True
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
        upper: float = DEFAULT_UPPER,
        lower: float = DEFAULT_LOWER,
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
        super().__init__(metric=metric, mode=mode, seed=seed)
        check_bounds(upper, lower)
        beta, tau = check_non_negative("beta", beta), check_non_negative("tau", tau)
        if candidates is not None and (
            isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1
        ):
            raise ValueError(f"candidates must be a positive int (the most cells) or None, got {candidates!r}.")
        self._budget = candidates
        self._settings: _Settings = {"upper": float(upper), "lower": float(lower), "beta": beta, "tau": tau}
        self._draw_count(distribution)
        self._cells: SearchCells | None = None
        self._sampler: BoundedDensitySampler | None = None
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
    def density_upper(self) -> float:
        """C: every draw's density is at most C × prior (checked before each draw), so Lemma A.4 may use it."""
        return self._settings["upper"]

    @property
    def cells(self) -> SearchCells | None:
        """The partition of the space the sampling law lives on (None before the space is known)."""
        return self._cells

    def next_probabilities(self) -> np.ndarray:
        """Per-cell probabilities of the next draw, from the trials completed so far (cached)."""
        if self._sampler is None:
            raise RuntimeError(
                "DPHyPOSearcher has no search space: pass `space=` to it or `param_space=` to tune.Tuner."
            )
        if self._cache is None or self._cache[0] != len(self._observations):
            assert self._cells is not None  # set with the sampler
            width = self._cells.features.shape[1]
            x = np.array([obs[0] for obs in self._observations], dtype=float).reshape(-1, width)
            y = np.array([obs[1] for obs in self._observations]) * (-1.0 if self._mode == "min" else 1.0)
            self._cache = (len(self._observations), self._sampler.probabilities(self._cells.features, x, y))
        return self._cache[1]

    # ------------------------------------------------------------------ Searcher API
    def _propose(self, trial_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        assert self._sampler is not None and self._cells is not None  # suggest() refuses to propose without a space
        cell = self._sampler.draw(self.next_probabilities())  # checks [c, C]·prior first
        config, features = self._cells.sample(cell, self._sampler.rng)
        return config, {"config": config, "x": features, "completed": False}

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        """Records the trial's score (if any) for the next draws; a second call is ignored."""
        record = self._suggested.get(trial_id)
        if record is None or record["completed"]:
            return
        assert self._metric is not None  # suggest() refuses without a metric (needs_metric)
        record["completed"] = True
        score = None if error or not result else result.get(self._metric)
        if isinstance(score, numbers.Real) and not isinstance(score, bool) and math.isfinite(score):
            self._observations.append((record["x"], float(score)))
        else:
            logger.info("Trial %s finished without a finite %r; it does not inform the search.", trial_id, self._metric)

    def _extra_state(self) -> dict[str, Any]:
        return {
            **super()._extra_state(),
            "settings": self._settings,
            "budget": self._budget,
            "sampler": self._sampler.get_state() if self._sampler else None,
            "cells": self._cells.to_state() if self._cells else None,
            "observations": self._observations,
            "cache": self._cache,
        }

    def _restore_extra(self, state: dict[str, Any]) -> None:
        super()._restore_extra(state)
        self._settings, self._budget = state["settings"], state["budget"]
        self._cells = None
        if state["cells"]:
            assert self._space is not None  # cells are saved only once the space is set
            self._cells = SearchCells.from_state(self._space, state["cells"])
        self._sampler = self._new_sampler() if self._cells else None
        if self._sampler is not None:
            self._sampler.set_state(state["sampler"])
            self._rng = self._sampler.rng  # one generator for T, the cells and every draw
        self._observations, self._cache = state["observations"], state["cache"]

    # ------------------------------------------------------------------ helpers
    def _set_space(self, space: dict[str, Any]) -> None:
        self._cells = build_cells(space, self._rng, self._budget)
        super()._set_space(space)
        self._sampler = self._new_sampler()

    def _new_sampler(self) -> BoundedDensitySampler:
        assert self._cells is not None  # built before the sampler
        return BoundedDensitySampler(self._cells.prior, rng=self._rng, **self._settings)
