"""Private release of a Bayesian optimisation's result: DP-BO (Kusner et al. 2015).

References:
    Kusner, Gardner, Garnett, Weinberger. "Differentially Private Bayesian
    Optimization", ICML 2015 (Kusner below): Algorithms 1–3, Theorems 1, 3, 5, 7.
    Srinivas, Krause, Kakade, Seeger. "Gaussian Process Optimization in the Bandit
    Setting", ICML 2010 (Srinivas below): Lemma 5.1, Theorem 1.

Threat model: the *validation* set V is private, the training data are public; a
neighbour V' swaps one validation record. Under Assumption 1 all f_V are jointly
GP(0, k1 ⊗ k2) with k2(λ, λ) = 1 and k1(V, V) = 1; k1 = k1(V, V') is a modelling
constant the user states (Kusner §6 finds 0.95 most likely: ``DEFAULT_K1``). The
(ε, δ) is Kusner's: the sensitivity bound holds with probability ≥ 1 − δ over the
GP draw of (f_V, f_V') and the observation noise, and the mechanism is ε-DP on that
event. Everything here is in the GP's units (f / prior std); numpy/scipy only. The
bound on γ_T lives in :mod:`ray_dptune.accounting.bounds.information_gain`.

Where this module departs from the paper, it is always towards *more* noise:

1. ṽ of Algorithm 1 (Theorem 3). The proof needs four events: GP-UCB's regret bound
   (Srinivas Thm 1) on V and on V', |f − f'| ≤ c on Λ, and the observation noise.
   With Algorithm 1's β_t each regret bound fails w.p. δ/2, so the paper's total
   exceeds δ; and its noise term q = σ√(4 log(3/δ)) treats √2·α̂/σ as N(0, 1),
   although α̂ is the largest of T noises and has variance σ². We split
   δ = δ/2 (β_t built with δ/2: regret bounds δ/4 each) + δ/4 (c) + δ/4 (noise, a
   union bound over the 2T Gaussian noises): see :func:`algorithm1_bounds`. Every
   term is ≥ the paper's (:func:`paper_algorithm1_laplace_scale`).
2. λ̃ of Algorithm 1 (Theorem 1) is the paper's, Δ = 2√β_{T+1} + c; its union bound
   holds: Srinivas Lemma 5.1 at the single time T + 1 fails w.p. |Λ|e^{−β_{T+1}/2}
   = 3δ_β/((T+1)²π²) ≤ 0.08δ per dataset, and c's event δ/3.
3. Algorithm 3 (Theorem 7 and the finite-Λ bound after it): the paper's
   min{g*/m, L/(mλ_min)} becomes g*/m. Assumption 2 (g Lipschitz in w) says nothing
   about swapping g's data argument, so L/(mλ_min) is not proven from it (and the
   supplementary proof is not available); g*/m is, for 0 ≤ g ≤ g*.
4. Algorithm 2 (noise-free, Theorem 5) is refused: see :func:`algorithm2_laplace_scale`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.bounds.rounding import round_up
from ray_dptune.errors import PrivacyError, UnsupportedBoundError

__all__ = [
    "DEFAULT_K1",
    "Algorithm1Bounds",
    "Release",
    "algorithm1_bounds",
    "algorithm2_laplace_scale",
    "algorithm3_laplace_scale",
    "algorithm3_sensitivity",
    "beta_t",
    "check_k1",
    "dataset_shift_bound",
    "exponential_mechanism_probabilities",
    "paper_algorithm1_laplace_scale",
    "paper_algorithm3_laplace_scale",
    "srinivas_c1",
]

DEFAULT_K1 = 0.95  # Kusner §6, Figure 1: the most likely k1(V, V') for SVM validation accuracies
Release = Literal["both", "config", "score"]


def _floor_normal(value: float) -> float:
    """A positive quantity that underflowed below the smallest normal double, raised to it (never below the truth)."""
    return max(value, sys.float_info.min)


def _log_quotient(factors: tuple[float, ...], denominator: float) -> float:
    """log(Π factors / denominator): the direct quotient where it is a finite positive double, else a sum of logs."""
    try:
        quotient = math.prod(factors) / denominator
    except OverflowError:  # an int beyond any double
        quotient = math.inf
    if 0.0 < quotient < math.inf:
        return math.log(quotient)
    return math.fsum(math.log(f) for f in factors) - math.log(denominator)


def _product(*factors: float) -> float:
    """Π factors, 0 if any is 0 (inf · 0 would be NaN; an overflowed factor of a zero product is finite)."""
    return 0.0 if 0.0 in factors else math.prod(factors)


def _check_probability(name: str, value: float) -> float:
    return validate.probability(name, value, open_left=True, open_right=True)


def check_k1(k1: float) -> float:
    """Validates k1(V, V') ∈ [0, 1] (a normalised dataset kernel: k1(V, V) = 1)."""
    if isinstance(k1, bool) or not isinstance(k1, (int, float, np.floating)):
        raise ValueError(f"k1 must be a number in [0, 1], got {k1!r}.")  # noqa: TRY004
    k1 = float(k1)
    if not 0.0 <= k1 <= 1.0:
        raise ValueError(f"k1 = k1(V, V') must lie in [0, 1] (k1(V, V) = 1, Kusner Assumption 1), got {k1}.")
    return k1


# ---------------------------------------------------------------------------- GP-UCB constants
def beta_t(t: int, n_candidates: int, *, delta: float) -> float:
    """β_t = 2 log(|Λ| t² π² / (3δ)) (Kusner Algorithm 1).

    This is Srinivas Theorem 1's β_t = 2 log(|D| t² π² / (6δ')) with δ' = δ/2: with it,
    GP-UCB's regret bound (and Srinivas Lemma 5.1) holds with probability ≥ 1 − δ/2.
    """
    t, n = validate.count("t", t), validate.count("n_candidates", n_candidates)
    return round_up(2.0 * _log_quotient((n, t, t, math.pi**2), 3.0 * _check_probability("delta", delta)))


def dataset_shift_bound(k1: float, n_candidates: int, *, failure: float) -> float:
    """The bound c with max_{λ∈Λ} |f_V(λ) − f_V'(λ)| ≤ c except with probability ``failure`` (Kusner Thm 1).

    f_V(λ) − f_V'(λ) ~ N(0, σ1²), σ1² = 2(1 − k1) (Assumption 1, k1(V, V) = 1); with
    P[|Z| > γ] ≤ e^{−γ²/2} and a union bound over Λ, c = σ1·√(2 log(|Λ|/failure))
    = 2√((1 − k1) log(|Λ|/failure)). Algorithm 1's c is failure = δ/3:
    2√((1 − k1) log(3|Λ|/δ)).
    """
    k1, n = check_k1(k1), validate.count("n_candidates", n_candidates)
    return round_up(2.0 * math.sqrt((1.0 - k1) * _log_quotient((n,), _check_probability("failure", failure))))


def srinivas_c1(noise_variance: float) -> float:
    """C1 = 8 / log(1 + σ⁻²) (Srinivas Theorem 1; Kusner Algorithm 1), for k(λ, λ) ≤ 1; inf if it overflows."""
    variance = validate.fixed_positive("noise_variance", noise_variance)
    inverse = 1.0 / variance
    log_term = math.log1p(inverse) if math.isfinite(inverse) else math.log1p(variance) - math.log(variance)
    return round_up(8.0 / log_term)


def exponential_mechanism_probabilities(scores: np.ndarray, *, epsilon: float, sensitivity: float) -> np.ndarray:
    """P[λ] ∝ exp(ε·μ(λ) / (2Δ)) (McSherry & Talwar 2007; Kusner Definition 4, Algorithm 1).

    Computed as a softmax of the scores shifted by their maximum, so large scores cannot overflow.

    Args:
        scores: (n,) the quality μ of each candidate (finite).
        epsilon: ε > 0.
        sensitivity: Δ > 0, a bound on |μ_V(λ) − μ_V'(λ)| for every λ.

    Example:
        >>> exponential_mechanism_probabilities(np.array([0.0, 0.0]), epsilon=1.0, sensitivity=1.0)
        array([0.5, 0.5])
    """
    s = validate.finite_array("scores", scores)
    if s.ndim != 1 or s.size == 0:
        raise ValueError("scores must be a non-empty 1-D array of finite numbers.")
    scale = validate.fixed_positive("epsilon", epsilon) / (2.0 * validate.fixed_positive("sensitivity", sensitivity))
    with np.errstate(over="ignore", invalid="ignore"):  # a difference below -1.8e308 is -inf: probability 0
        difference = s - s.max()
        logits = np.where(difference == 0.0, 0.0, difference * scale)  # the best keep 0 even for scale = inf
        p = np.exp(np.where(np.isnan(logits), 0.0, logits))  # NaN: -inf · 0 (scale underflowed): uniform
    probabilities: np.ndarray = p / p.sum()
    return probabilities


# ---------------------------------------------------------------------------- Algorithm 1
@dataclass(frozen=True)
class Algorithm1Bounds:
    """Every constant of a DP-BO Algorithm 1 release (GP units; JSON via :meth:`to_dict`).

    Attributes:
        n_candidates, num_trials: |Λ| and T. epsilon, delta: (ε, δ) of each release.
        delta_beta: the δ in GP-UCB's β_t (δ when only λ̃ is released, δ/2 with ṽ).
        beta_T, beta_T_plus_1: β_T and β_{T+1}.
        c: Algorithm 1's c = 2√((1 − k1) log(3|Λ|/δ)) (Theorem 1, for λ̃).
        em_sensitivity: Δ = 2√β_{T+1} + c (Theorem 1).
        c1, gamma_T: Srinivas's C1 and the bound on γ_T.
        c_score, q_score: Theorem 3's c and noise term with δ/4 each (module docstring).
        regret_term: √(C1 β_T γ_T / T) (Srinivas Theorem 1).
        score_sensitivity: regret_term + c_score + q_score (Theorem 3, union bound redone).
        laplace_scale: score_sensitivity / ε, the scale of ṽ's Laplace noise.
    """

    n_candidates: int
    num_trials: int
    epsilon: float
    delta: float
    k1: float
    noise_variance: float
    delta_beta: float
    beta_T: float
    beta_T_plus_1: float
    c: float
    em_sensitivity: float
    c1: float
    gamma_T: float
    c_score: float
    q_score: float
    regret_term: float
    score_sensitivity: float
    laplace_scale: float

    def to_dict(self) -> dict[str, float | int]:
        """The constants as a plain dict."""
        return asdict(self)


def algorithm1_bounds(
    *,
    n_candidates: int,
    num_trials: int,
    epsilon: float,
    delta: float,
    k1: float,
    noise_variance: float,
    gamma_bound: float,
    release: Release = "both",
) -> Algorithm1Bounds:
    """Sensitivities and noise of Kusner Algorithm 1 (noisy observations) for both releases.

    λ̃ (Theorem 1, Corollary 1): exponential mechanism on μ_T with Δ = 2√β_{T+1} + c,
    c = 2√((1 − k1) log(3|Λ|/δ)); failure ≤ 2·3δ_β/((T+1)²π²) + δ/3 ≤ δ.

    ṽ (Theorem 3, Corollary 2, union bound redone, module docstring item 1): Laplace
    noise of scale (√(C1 β_T γ_T / T) + c_v + q_v)/ε with β_t built on δ_β = δ/2,
    c_v = 2√((1 − k1) log(4|Λ|/δ)) and q_v = 2σ√(2 log(8T/δ)) (all 2T noises
    |α| ≤ σ√(2 log(8T/δ)) except w.p. δ/4). Failure ≤ δ/4 + δ/4 + δ/4 + δ/4 = δ.

    Args:
        n_candidates: |Λ|.
        num_trials: T.
        epsilon: ε of *each* release.
        delta: δ of *each* release.
        k1: k1(V, V') ∈ [0, 1].
        noise_variance: σ² > 0 in GP units.
        gamma_bound: an upper bound on γ_T
            (:func:`~ray_dptune.accounting.bounds.information_gain.max_information_gain_bound`).
        release: "config" (λ̃ only: β_t on δ), "score" or "both" (β_t on δ/2).
    """
    n, t = validate.count("n_candidates", n_candidates), validate.count("num_trials", num_trials)
    eps, delta = validate.fixed_positive("epsilon", epsilon), _check_probability("delta", delta)
    k1, sigma2 = check_k1(k1), validate.fixed_positive("noise_variance", noise_variance)
    gamma = float(gamma_bound)
    if not (math.isfinite(gamma) and gamma >= 0.0):
        raise ValueError(f"gamma_bound must be a finite number >= 0, got {gamma_bound}.")
    if release not in ("both", "config", "score"):
        raise ValueError(f"release must be 'both', 'config' or 'score', got {release!r}.")
    delta_beta = delta if release == "config" else delta / 2.0
    beta_t_, beta_next = beta_t(t, n, delta=delta_beta), beta_t(t + 1, n, delta=delta_beta)
    c = dataset_shift_bound(k1, n, failure=delta / 3.0)
    lemma51_failure = 2.0 * 3.0 * delta_beta / ((t + 1) ** 2 * math.pi**2)  # both datasets, time T + 1
    if lemma51_failure + delta / 3.0 > delta:  # cannot happen (≤ 0.16δ + δ/3): guards edits of this code
        raise PrivacyError(f"Theorem 1's union bound exceeds delta = {delta}.")
    c1 = srinivas_c1(sigma2)
    regret = round_up(math.sqrt(_product(c1, beta_t_, gamma) / t))
    c_score = dataset_shift_bound(k1, n, failure=delta / 4.0)
    q_score = round_up(2.0 * math.sqrt(sigma2) * math.sqrt(2.0 * _log_quotient((2.0, t), delta / 4.0)))
    score_sensitivity = round_up(regret + c_score + q_score)
    return Algorithm1Bounds(
        n_candidates=n,
        num_trials=t,
        epsilon=eps,
        delta=delta,
        k1=k1,
        noise_variance=sigma2,
        delta_beta=delta_beta,
        beta_T=beta_t_,
        beta_T_plus_1=beta_next,
        c=c,
        em_sensitivity=round_up(2.0 * math.sqrt(beta_next) + c),
        c1=c1,
        gamma_T=gamma,
        c_score=c_score,
        q_score=q_score,
        regret_term=regret,
        score_sensitivity=score_sensitivity,
        laplace_scale=round_up(score_sensitivity / eps),
    )


def paper_algorithm1_laplace_scale(
    *, n_candidates: int, num_trials: int, epsilon: float, delta: float, k1: float, noise_variance: float, gamma: float
) -> float:
    """Kusner Algorithm 1's printed scale √(C1 β_T γ_T)/(ε√T) + c/ε + q/ε, q = σ√(4 log(3/δ)).

    For reference and tests only: its union bound exceeds δ (module docstring, item 1);
    :func:`algorithm1_bounds` gives the scale the searcher uses, which is never smaller.
    """
    t = validate.count("num_trials", num_trials)
    epsilon, gamma = validate.fixed_positive("epsilon", epsilon), validate.non_negative("gamma", gamma)
    noise_variance = validate.fixed_positive("noise_variance", noise_variance)
    beta = beta_t(t, n_candidates, delta=delta)
    c = dataset_shift_bound(k1, n_candidates, failure=delta / 3.0)
    q = math.sqrt(noise_variance) * math.sqrt(4.0 * _log_quotient((3.0,), delta))
    return (math.sqrt(_product(srinivas_c1(noise_variance), beta, gamma)) / math.sqrt(t) + c + q) / epsilon


# ---------------------------------------------------------------------------- Algorithm 2
def algorithm2_laplace_scale(**kwargs: object) -> float:
    """Kusner Algorithm 2 (noise-free observations, Theorem 5): refused.

    Raises:
        UnsupportedBoundError: always. The scale (A/ε)·e^{−2τ/(log 2)^{d/4}} + c/ε uses
            the constants A and τ of de Freitas, Smola & Zoghi (2012, Theorem 2), which
            that theorem shows to *exist* for a function meeting its conditions (a unique
            interior maximum with a negative definite Hessian, ...) but which depend on
            the unknown f_V — the private data — and are not computable from public
            inputs. The printed term does not depend on T although de Freitas's bound
            decays in T, the method is de Freitas's branch-and-bound, not GP-UCB on a
            finite Λ, and Theorem 5's proof is in a supplement we could not check.
    """
    raise UnsupportedBoundError(
        "DP-BO Algorithm 2 (noise-free observations, Kusner et al. Theorem 5) needs the constants A and τ "
        "of de Freitas et al. (2012, Theorem 2), which exist under that theorem's conditions but depend on the "
        "unknown (private) validation function and cannot be computed; no proven noise scale can be stated. "
        "Use algorithm=1 (noisy observations, σ² > 0) or algorithm=3 (Lipschitz and convex, Assumption 2)."
    )


# ---------------------------------------------------------------------------- Algorithm 3
def algorithm3_sensitivity(
    *, lipschitz: float, g_star: float, validation_size: int, lambda_min: float, lambda_max: float
) -> float:
    """Δ_f ≤ (λ_max − λ_min)·L/(λ_max·λ_min) + g*/m (Kusner Theorem 7 and the bound after it).

    Theorem 7: ‖w_λ − w_λ'‖ ≤ (λ' − λ)/(λλ') for the minimisers of (λ/2)‖w‖² + (1/n)Σℓ
    with ℓ convex and 1-Lipschitz in w (strong convexity), so with g L-Lipschitz in w,
    |f_V(w_λ) − f_V(w_λ')| ≤ L(1/λ − 1/λ'), largest at (λ_min, λ_max). Swapping one of
    m validation records with 0 ≤ g ≤ g* moves f_V by ≤ g*/m. The paper's
    min{g*/m, L/(mλ_min)} is replaced by g*/m (module docstring item 3): never smaller.
    Holds for any acquisition and any T, and for the best of any subset of Λ.
    """
    lip, g, m, lo, hi = _algorithm3_arguments(lipschitz, g_star, validation_size, lambda_min, lambda_max)
    return round_up(_lambda_spread(lip, lo, hi) + _floor_normal(g / m))


def _algorithm3_arguments(
    lipschitz: float, g_star: float, validation_size: int, lambda_min: float, lambda_max: float
) -> tuple[float, float, int, float, float]:
    lip, g = validate.fixed_positive("lipschitz (L)", lipschitz), validate.fixed_positive("g_star (g*)", g_star)
    m = validate.count("validation_size (m)", validation_size)
    lo, hi = validate.fixed_positive("lambda_min", lambda_min), validate.fixed_positive("lambda_max", lambda_max)
    if hi < lo:
        raise ValueError(f"lambda_max = {hi} is below lambda_min = {lo}.")
    return lip, g, m, lo, hi


def _is_normal(value: float) -> bool:
    return sys.float_info.min <= value < math.inf


def _lambda_spread(lip: float, lo: float, hi: float) -> float:
    """L(1/λ_min − 1/λ_max) as (λ_max − λ_min)L/(λ_max·λ_min); where that under- or overflows, rounded up."""
    if hi == lo:
        return 0.0
    numerator, product = (hi - lo) * lip, hi * lo
    if _is_normal(numerator) and _is_normal(product) and _is_normal(numerator / product):
        return numerator / product
    # each reciprocal and the difference round by at most ulp(1/λ_min)/2: two ulps cover them
    return lip * (1.0 / lo - 1.0 / hi + 2.0 * math.ulp(1.0 / lo))


def algorithm3_laplace_scale(
    *, epsilon: float, lipschitz: float, g_star: float, validation_size: int, lambda_min: float, lambda_max: float
) -> float:
    """Scale of Kusner Algorithm 3's Laplace noise: Δ_f/ε (Corollary 4: ε-DP, δ = 0)."""
    sensitivity = algorithm3_sensitivity(
        lipschitz=lipschitz,
        g_star=g_star,
        validation_size=validation_size,
        lambda_min=lambda_min,
        lambda_max=lambda_max,
    )
    return round_up(_floor_normal(sensitivity / validate.fixed_positive("epsilon", epsilon)))


def paper_algorithm3_laplace_scale(
    *, epsilon: float, lipschitz: float, g_star: float, validation_size: int, lambda_min: float, lambda_max: float
) -> float:
    """Algorithm 3 as printed: (1/ε)min{g*/m, L/(mλ_min)} + (λ_max − λ_min)L/(ελ_maxλ_min) (reference only)."""
    lip, g, m, lo, hi = _algorithm3_arguments(lipschitz, g_star, validation_size, lambda_min, lambda_max)
    epsilon = validate.fixed_positive("epsilon", epsilon)
    first = min(g / m, lip / (m * lo))
    denominator = epsilon * hi * lo
    if _is_normal(denominator):
        return first / epsilon + (hi - lo) * lip / denominator
    return first / epsilon + _lambda_spread(lip, lo, hi) / epsilon
