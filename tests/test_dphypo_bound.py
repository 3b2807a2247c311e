"""DP-HyPO's adaptive bound (Lemma A.5 evaluated numerically) against exact adaptive ground truth.

An adaptive search is exact on small discrete cases: N hyperparameters with
prior 1/N, base mechanisms with m totally ordered outputs (laws P_λ on D, Q_λ on
D'), and a sampler whose density π ∈ S_{C,c} = {c/N <= π(λ) <= C/N, Σπ = 1}
depends on the history through (best output so far, last output). The history is
then a Markov chain, and the released best output after T ~ law runs has the law
A = Σ_k P[T=k] · (best-so-far marginal after k steps), the same under D and D'
for the same sampler. Every sum is of non-negative terms (no cancellation), so
double precision is exact to ~1e-13 relative; T is cut where its tail is < 1e-16.

The sampler is adversarial: for each mechanism pair, coordinate ascent over the
vertices of S_{C,c}, state by state, maximises the exact divergence at each order.
A bound fails only with the mechanism, sampler, order, bound and true value.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from ray_dptune.accounting import RDPCurve, generic_repeat_and_select
from ray_dptune.accounting.dphypo_bound import dphypo_lemma_bound, lemma_a4_curve
from ray_dptune.accounting.selection import truncated_negative_binomial_bound
from ray_dptune.accounting.spend import TrialSpend
from ray_dptune.accounting.distributions import Geometric, Logarithmic, RunCountDistribution, TruncatedNegativeBinomial

ORDERS = np.array([1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0])
INFLATION = 1.0 + 1e-9  # the exact base curve, rounded up
TOLERANCE = 1e-9  # a bound passes if bound >= truth - TOLERANCE (float64 sums of positive terms)


# --------------------------------------------------------------------------- exact adaptive best-of-T
def vertices(n: int, upper: float, lower: float) -> np.ndarray:
    """The distinct vertices of S_{C,c} (greedy fill in every order of the arms): shape (V, n)."""
    out = set()
    for order in itertools.permutations(range(n)):
        x, left = np.full(n, lower / n), 1.0 - lower
        for arm in order:
            add = min(left, (upper - lower) / n)
            x[arm] += add
            left -= add
        out.add(tuple(np.round(x, 15)))
    return np.array(sorted(out))


def best_of_t_laws(policies: np.ndarray, mech: np.ndarray, law: RunCountDistribution) -> np.ndarray:
    """Exact laws of the best output after T runs of adaptive samplers on base laws ``mech``.

    Args:
        policies: (B, 1 + m*m, N) sampling law per state, for B samplers; state 0 =
            no run yet, state 1 + b*m + l = best output b, last output l.
        mech: (N, m) output laws of the base mechanisms on one dataset.
        law: law of T (P[T=0] = 0: a TNB).

    Returns:
        (B, m) probability of each released output (the mass of T beyond the cut,
        < 1e-16, is left out).
    """
    m = mech.shape[1]
    states = 1 + m * m
    out = policies @ mech  # (B, S, m): law of the next output in each state
    target = np.array(
        [[1 + max(b, y) * m + y for y in range(m)] for b in [-1] + [b for b in range(m) for _ in range(m)]]
    )
    move = np.zeros((states, m, states))
    move[np.arange(states)[:, None], np.arange(m)[None, :], target] = 1.0
    step = np.einsum("bsy,syt->bst", out, move)  # (B, S, S) transition matrices
    pmf = law.pmf(np.arange(1, 20001))
    tail = np.cumsum(pmf[::-1])[::-1]  # P[T >= k], summed from the small end
    pmf = pmf[: int(np.count_nonzero(tail >= 1e-17)) + 1]
    v = np.zeros((policies.shape[0], states))
    v[:, 0] = 1.0
    reached = np.zeros_like(v)
    for weight in pmf:
        v = np.einsum("bs,bst->bt", v, step)
        reached += weight * v
    return reached[:, 1:].reshape(-1, m, m).sum(axis=2)


def renyi(a: np.ndarray, b: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """D_α(a‖b) per order, log-space; inf where a has mass outside b's support."""
    keep = a > 0
    if np.any(b[keep] <= 0):
        return np.full(orders.shape, np.inf)
    la, lb = np.log(a[keep]), np.log(b[keep])
    terms = orders[:, None] * la[None, :] + (1.0 - orders[:, None]) * lb[None, :]
    top = terms.max(axis=1)
    return (top + np.log(np.exp(terms - top[:, None]).sum(axis=1))) / (orders - 1.0)


def symmetric(a: np.ndarray, b: np.ndarray, orders: np.ndarray) -> np.ndarray:
    return np.maximum(renyi(a, b, orders), renyi(b, a, orders))


def base_curve(p: np.ndarray, q: np.ndarray, orders: np.ndarray) -> RDPCurve:
    """Exact sup_λ of both directions' divergences of the base pairs, rounded up."""
    eps = np.max([symmetric(p[i], q[i], orders) for i in range(p.shape[0])], axis=0)
    return RDPCurve(orders, eps * INFLATION + 1e-15)


def adversarial_truth(p, q, law, upper, lower, targets=(2.0, 8.0, 32.0), sweeps=3, seed=0):
    """Exact divergences on ORDERS of the worst vertex samplers found by coordinate ascent.

    For each target order, ascent starts from the best fixed (non-adaptive) vertex
    sampler and from a random one, and changes one state's vertex at a time (all
    alternatives of a state at once) while the exact divergence at that order grows.
    Every sampler found is a real adaptive search, so the max over them, at each
    order of ORDERS, is a true divergence (a lower bound on the worst case).

    Returns:
        (truth on ORDERS, the sampler reaching it at each order).
    """
    n, m = p.shape
    verts = vertices(n, upper, lower)
    states, rng = 1 + m * m, np.random.default_rng(seed)
    fixed = _divergences(np.repeat(verts[:, None, :], states, axis=1), p, q, law, np.asarray(targets))
    found = []
    for j, alpha in enumerate(targets):
        for choice in (np.full(states, int(np.argmax(fixed[:, j]))), rng.integers(len(verts), size=states)):
            value = -np.inf
            for _ in range(sweeps):
                improved = False
                for s in rng.permutation(states):
                    trials = np.repeat(choice[None, :], len(verts), axis=0)
                    trials[:, s] = np.arange(len(verts))
                    vals = _divergences(verts[trials], p, q, law, np.array([alpha]))[:, 0]
                    k = int(np.argmax(vals))
                    if vals[k] > value + 1e-13 * abs(value):
                        improved |= k != choice[s]
                        choice, value = trials[k], vals[k]
                if not improved:
                    break
            found.append(verts[choice])
    truths = _divergences(np.array(found), p, q, law, ORDERS)  # (samplers, orders)
    best = np.argmax(truths, axis=0)
    return truths.max(axis=0), [found[i] for i in best]


def _divergences(policies, p, q, law, orders) -> np.ndarray:
    a, b = best_of_t_laws(policies, p, law), best_of_t_laws(policies, q, law)
    return np.array([symmetric(a[i], b[i], orders) for i in range(len(a))])


# --------------------------------------------------------------------------- cases
def draw_mechanisms(seed: int, n: int, m: int, spread: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([1306, seed, n, m])
    p = rng.dirichlet(np.ones(m), size=n)
    q = p * np.exp(spread * rng.standard_normal((n, m)))
    return p, q / q.sum(axis=1, keepdims=True)


def probe(p_top: float, q_top: float) -> tuple[np.ndarray, np.ndarray]:
    """Arm 0 is a private probe (outputs 0 < 1, P[1] = p_top on D, q_top on D'); arms 1, 2 are
    data-independent and output 3 (the top) and 2. A sampler that favours arm 1 after a probe
    output 1 leaks the probe's outputs through the released best, across runs."""
    tiny = 1e-12
    p = np.array([[1 - p_top, p_top, tiny, tiny], [tiny, tiny, tiny, 1.0], [tiny, tiny, 1.0, tiny]])
    q = p.copy()
    q[0, :2] = 1 - q_top, q_top
    return p / p.sum(axis=1, keepdims=True), q / q.sum(axis=1, keepdims=True)


CASES = [  # name, mechanisms, law, C, c
    ("probe-strong-geo10", probe(0.99, 0.01), Geometric.from_mean(10.0), 2.7, 0.15),
    ("probe-geo3", probe(0.9, 0.1), Geometric.from_mean(3.0), 2.7, 0.15),
    ("probe-log5-paper-C", probe(0.5, 0.2), Logarithmic.from_mean(5.0), 2.0, 0.75),
    ("random-3arms", draw_mechanisms(7, 3, 3, 1.0), Logarithmic.from_mean(4.0), 2.0, 0.5),
    ("random-eta-half", draw_mechanisms(9, 2, 4, 2.0), TruncatedNegativeBinomial.from_mean(0.5, 4.0), 1.5, 0.5),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_no_bound_below_the_exact_adaptive_truth(case):
    name, (p, q), law, upper, lower = case
    base = base_curve(p, q, ORDERS)
    truth, policies = adversarial_truth(p, q, law, upper, lower)
    ratio = upper / lower
    bounds = {
        "lemma A.5, C known": dphypo_lemma_bound(base, law, density_ratio=ratio, upper=upper),
        "lemma A.5": dphypo_lemma_bound(base, law, density_ratio=ratio),
        "closed form (Thm 1)": truncated_negative_binomial_bound(base, law, density_ratio=ratio),
    }
    for label, curve in bounds.items():
        for j, alpha in enumerate(ORDERS):
            assert curve.epsilons[j] >= truth[j] - TOLERANCE, (
                f"{label} below the exact adaptive truth: {name}, P={p.tolist()}, P'={q.tolist()}, "
                f"{law!r}, C={upper}, c={lower}, order {alpha}: bound {curve.epsilons[j]} < "
                f"truth {truth[j]}; sampler per state {policies[j].tolist()}"
            )


@pytest.mark.slow
def test_the_audit_has_teeth():
    """The truth exceeds the base curve (a bound without the selection term is caught), and the
    ascent finds adaptive samplers that beat every fixed sampler on the same mechanisms."""
    _, (p, q), law, upper, lower = CASES[0]
    truth, _ = adversarial_truth(p, q, law, upper, lower)
    assert np.all(truth[ORDERS >= 3] > base_curve(p, q, ORDERS).epsilons[ORDERS >= 3] + 1.0)
    _, (p, q), law, upper, lower = CASES[2]
    truth, _ = adversarial_truth(p, q, law, upper, lower)
    verts = vertices(3, upper, lower)
    fixed = _divergences(np.repeat(verts[:, None, :], 1 + 16, axis=1), p, q, law, ORDERS).max(axis=0)
    assert np.max(truth - fixed) > 0.02, (truth, fixed)


# --------------------------------------------------------------------------- against the closed form
ZCDP = RDPCurve.gaussian(noise_multiplier=math.sqrt(5.0))  # 0.1-zCDP
DIGITS = TrialSpend(sample_rate=0.044537, noise_multiplier=1.3894, steps=110).curve()


@pytest.mark.parametrize(
    ("base", "law", "delta", "expected_at_most"),
    [
        (ZCDP, TruncatedNegativeBinomial.from_mean(0.0, 10.0), 1e-6, 4.97),
        (ZCDP, TruncatedNegativeBinomial.from_mean(1.0, 10.0), 1e-6, 5.92),
        (DIGITS, Geometric(0.01), 1e-5, 6.86),
    ],
    ids=["zcdp-log", "zcdp-geo", "digits-geo"],
)
def test_below_the_closed_form(base, law, delta, expected_at_most):
    ratio = 2.0 / 0.75
    closed = truncated_negative_binomial_bound(base, law, density_ratio=ratio)
    new = dphypo_lemma_bound(base, law, density_ratio=ratio)
    assert new.epsilon(delta=delta) < closed.epsilon(delta=delta) - 0.5
    assert new.epsilon(delta=delta) <= expected_at_most
    known = dphypo_lemma_bound(base, law, density_ratio=ratio, upper=2.0)
    assert np.all(known.epsilons <= new.epsilons + 1e-12)


@pytest.mark.slow
def test_limits_and_monotonicity():
    law = Geometric.from_mean(10.0)
    plain = dphypo_lemma_bound(ZCDP, law, density_ratio=1.0)
    lemma_7 = generic_repeat_and_select(RDPCurve(ZCDP.orders, ZCDP.epsilons), law)  # RDP constraints only
    eps_plain, eps_7 = plain.epsilon(delta=1e-6), lemma_7.epsilon(delta=1e-6)
    assert abs(eps_plain - eps_7) <= 0.01 * eps_7  # C = c = 1: P&S Lemma 7 numerically
    values = [dphypo_lemma_bound(ZCDP, law, density_ratio=r).epsilon(delta=1e-6) for r in (1.0, 1.5, 2.0, 4.0)]
    assert values == sorted(values)
    same = dphypo_lemma_bound(ZCDP, law, density_ratio=2.0, upper=2.0)
    assert np.array_equal(same.epsilons, dphypo_lemma_bound(ZCDP, law, density_ratio=2.0).epsilons)


def test_lemma_a4_curve_and_arguments():
    a = lemma_a4_curve(ZCDP, density_ratio=2.0, upper=1.5)
    lam = ZCDP.orders
    assert np.allclose(a.epsilons, ZCDP.epsilons + math.log(2.0) + math.log(1.5) / (lam - 1.0))
    with pytest.raises(ValueError, match="upper"):
        dphypo_lemma_bound(ZCDP, Geometric(0.1), density_ratio=2.0, upper=3.0)
    with pytest.raises(ValueError, match="density_ratio"):
        dphypo_lemma_bound(ZCDP, Geometric(0.1), density_ratio=0.5)
    with pytest.raises(TypeError):
        dphypo_lemma_bound(ZCDP, Geometric(0.1), 2.0)  # the privacy argument is keyword-only
