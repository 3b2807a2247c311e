"""Exact ground-truth audit: no repeat-and-select bound may be below the truth.

For a base mechanism with finitely many totally ordered outputs 0..m-1, law P on
a dataset and P' on a neighbour, "run it K times, release the best output" has
an exact output law (P&S 2022, proof of Lemma 7):

    A(y) = f(F(y)) - f(F(y-1)),   plus an atom ⊥ of mass f(0) when K = 0,

with F the CDF of P and f(x) = E[x^K] the PGF of K. Its exact Rényi divergences
and (ε, δ) profile are computed here at 50 significant digits (mpmath) and
compared with every bound the library gives for the same pair, fed the pair's
exact base RDP curve (rounded up) and, for Poisson K, its exact (ε, δ) profile.

An optimistic bound (below the truth) is the worst possible bug, so a check fails
only with a concrete mechanism, order (or δ), bound and true value in its message.
The last tests show that the audit has teeth (wrong bounds are caught) and pin
how tight each bound is on these mechanisms.

The grids (every law x every mechanism family) are exhaustive only with
``pytest --exhaustive`` (tests/conftest.py). The default run audits a seeded subset
of each grid (``default_cases``) that still holds every law family (Poisson, TNB at
η = -0.5 and 3, the logarithmic η = 0, the geometric η = 1, point masses), both ends
of every parameter (μ 0.5 and 50, means 2 and 100, k 1 and 4) and every mechanism
family; every other test here runs in full either way.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable

import mpmath
import numpy as np
import pytest

from ray_dptune.accounting import RDPCurve, generic_repeat_and_select, repeat_and_select
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
)

ORDERS = 1.0 + np.logspace(-2.0, 3.0, 60)
DELTAS = (1e-2, 1e-4, 1e-6)
RTOL = 1e-9  # a bound passes if bound >= truth (1 - RTOL) - ATOL
ATOL = 1e-12
BASE_INFLATION = 1.0 + 1e-12  # the exact base curve/profile, rounded up: always >= truth

MP = mpmath.MPContext()  # a private context: the precision of other tests is untouched
MP.dps = 50
MP_ORDERS = [MP.mpf(float(a)) for a in ORDERS]


# --------------------------------------------------------------------------- exact math
def pgf(law: RunCountDistribution) -> Callable:
    """f(x) = E[x^K] in high precision, from the law's own parameters (P&S eq. 7)."""
    if isinstance(law, Poisson):
        mu = MP.mpf(law.mean)
        return lambda x: MP.exp(mu * (x - 1))
    if isinstance(law, PointMass):
        k = law.k
        return lambda x: x**k
    if isinstance(law, TruncatedNegativeBinomial):
        eta, gamma = MP.mpf(law.eta), MP.mpf(law.gamma)
        if law.eta == 0.0:
            return lambda x: MP.log(1 - (1 - gamma) * x) / MP.log(gamma)
        return lambda x: ((1 - (1 - gamma) * x) ** (-eta) - 1) / (gamma ** (-eta) - 1)
    raise TypeError(f"no exact PGF for {law!r}")


def best_of_k_law(p: tuple, law: RunCountDistribution) -> list:
    """Exact law of the best of K draws from p: [A(⊥), A(0), ..., A(m-1)].

    A(⊥) = f(0) is the K = 0 output (the same symbol under both datasets);
    A(y) = f(F(y)) - f(F(y-1)). At 50 digits the difference keeps >= 30
    significant digits even for probabilities of 1e-16.
    """
    f = pgf(law)
    previous = f(MP.zero)
    out, cdf = [previous], MP.zero
    for mass in p:
        cdf += mass
        current = f(cdf)
        out.append(current - previous)
        previous = current
    return out


def renyi_divergences(a: list, b: list, orders: list) -> list:
    """D_α(a‖b) = log(Σ a^α b^(1-α)) / (α-1) at each order (exact to ~40 digits)."""
    terms = [(MP.log(x), MP.log(y) if y > 0 else None) for x, y in zip(a, b) if x > 0]
    if any(log_b is None for _, log_b in terms):
        return [MP.inf] * len(orders)
    return [MP.log(MP.fsum(MP.exp(al * la + (1 - al) * lb) for la, lb in terms)) / (al - 1) for al in orders]


def symmetric_renyi(a: list, b: list) -> np.ndarray:
    """max(D_α(a‖b), D_α(b‖a)) on ORDERS, rounded to the nearest double."""
    forward, backward = renyi_divergences(a, b, MP_ORDERS), renyi_divergences(b, a, MP_ORDERS)
    return np.array([float(max(u, v)) for u, v in zip(forward, backward)])


def hockey_stick(a: list, b: list, epsilon) -> mpmath.mpf:
    """H_{e^ε}(a‖b) = Σ max(0, a - e^ε b): the smallest δ of (ε, δ)-DP in this direction."""
    t = MP.exp(MP.mpf(epsilon))
    return MP.fsum(max(MP.zero, x - t * y) for x, y in zip(a, b))


def _one_way_epsilon(a: list, b: list, delta) -> mpmath.mpf:
    """Smallest ε >= 0 with H_{e^ε}(a‖b) <= δ, exactly (no bisection).

    H_t(a‖b) = max over sets S of a(S) - t b(S), so H_t <= δ iff t >= (a(S) - δ)/b(S)
    for every S with a(S) > δ; the maximising sets are the prefixes of the
    outputs sorted by likelihood ratio a/b.
    """
    by_ratio = sorted(range(len(a)), key=lambda i: a[i] / b[i] if b[i] > 0 else MP.inf, reverse=True)
    sum_a = sum_b = MP.zero
    t = MP.one
    for i in by_ratio:
        sum_a, sum_b = sum_a + a[i], sum_b + b[i]
        if sum_a > delta:
            if sum_b == 0:
                return MP.inf
            t = max(t, (sum_a - delta) / sum_b)
    return MP.log(t)


def true_epsilon(a: list, b: list, delta: float) -> float:
    """Exact ε(δ) of the pair: the smallest ε with both hockey-sticks <= δ."""
    d = MP.mpf(delta)
    return float(max(_one_way_epsilon(a, b, d), _one_way_epsilon(b, a, d)))


def exact_profile(p: tuple, q: tuple) -> Callable[[np.ndarray], np.ndarray]:
    """The pair's exact δ(ε), both directions, rounded up: a valid ``base_delta``."""

    def delta(epsilons: np.ndarray) -> np.ndarray:
        values = [max(hockey_stick(p, q, e), hockey_stick(q, p, e)) for e in np.asarray(epsilons, dtype=float)]
        return np.array([float(v) * BASE_INFLATION for v in values])

    return delta


# --------------------------------------------------------------------------- mechanisms
@dataclasses.dataclass(frozen=True)
class Pair:
    """Output laws of one base mechanism on two neighbouring datasets."""

    name: str
    p: tuple  # mpf, summing to 1
    q: tuple

    def describe(self) -> str:
        """Name and both laws, to 17 digits: enough to rebuild the mechanism."""
        return f"{self.name}: P={_digits(self.p)}, P'={_digits(self.q)}"


def _digits(values: tuple) -> str:
    return "[" + ", ".join(f"{float(v):.17g}" for v in values) + "]"


def _normalised(x: np.ndarray) -> tuple:
    values = [MP.mpf(float(v)) for v in x]
    total = MP.fsum(values)
    return tuple(v / total for v in values)


def _draw_pair(family: str, seed: int) -> Pair:
    """One random pair of a family; m = 2..6 outputs cycling with the seed."""
    rng = np.random.default_rng([2024, FAMILIES.index(family), seed])
    m = 2 + seed % 5
    p = rng.dirichlet(np.ones(m))
    if family == "vclose":  # nearly identical: tiny divergences, near-1 orders matter
        q = p * np.exp(0.02 * rng.standard_normal(m))
    elif family == "close":
        q = p * np.exp(0.3 * rng.standard_normal(m))
    elif family == "medium":
        q = p * np.exp(1.0 * rng.standard_normal(m))
    elif family == "far":  # unrelated laws
        q = rng.dirichlet(np.ones(m))
    elif family == "tiny":  # one output of probability 1e-6 ... 1e-16, others from a spiky Dirichlet
        p = np.maximum(rng.dirichlet(0.3 * np.ones(m)), 1e-12)
        p[rng.integers(m)] = 10.0 ** -(6 + 2 * (seed % 6))
        q = p * np.exp(0.5 * rng.standard_normal(m))
    elif family == "reversed":  # P favours the top outputs, P' the bottom ones
        p = np.sort(p)
        q = p[::-1] * np.exp(0.1 * rng.standard_normal(m))
    else:
        raise ValueError(family)
    return Pair(f"{family}-{seed}-m{m}", _normalised(p), _normalised(q))


FAMILIES = ("vclose", "close", "medium", "far", "tiny", "reversed")
SEEDS_PER_FAMILY = 6
PAIRS = {family: [_draw_pair(family, s) for s in range(SEEDS_PER_FAMILY)] for family in FAMILIES}
ALL_PAIRS = [pair for family in FAMILIES for pair in PAIRS[family]]


LAWS: dict[str, RunCountDistribution] = {
    **{f"poisson-{mu:g}": Poisson(mu) for mu in (0.5, 1.0, 3.0, 10.0, 50.0)},
    **{
        f"tnb-eta{eta:g}-mean{mean:g}": TruncatedNegativeBinomial.from_mean(eta, mean)
        for eta in (-0.5, 0.0, 0.5, 1.0, 3.0)
        for mean in (2.0, 10.0, 100.0)
    },
    "pointmass-1": PointMass(1),
    "pointmass-4": PointMass(4),
}
POISSON_LAWS = [name for name in LAWS if name.startswith("poisson")]

# --------------------------------------------------------------------------- the default run's subset
EDGE_LAWS = [
    "poisson-0.5",  # the smallest and largest Poisson means, and one between
    "poisson-3",
    "poisson-50",
    "tnb-eta-0.5-mean2",  # the smallest shape at both ends of the mean
    "tnb-eta-0.5-mean100",
    "tnb-eta0-mean2",  # η = 0: the logarithmic law
    "tnb-eta0.5-mean10",
    "tnb-eta1-mean100",  # η = 1: the geometric law
    "tnb-eta3-mean2",  # the largest shape at both ends of the mean
    "tnb-eta3-mean100",
    "pointmass-1",  # K fixed: the base mechanism itself, and a composition
    "pointmass-4",
]
"""Every law family and both ends of each parameter of LAWS: in the default run of every grid over laws."""
SUBSET_SEED = 23
"""The default run's subset of each grid is drawn with this seed (fixed: every run audits the same cases)."""


def default_cases(rows: list[str], columns: tuple, cover: list[str], extra: int = 0) -> set[tuple]:
    """A seeded subset of the grid ``rows`` x ``columns`` in which every row of ``cover`` and every column appears.

    Each row of ``cover`` meets one column, the columns dealt in a seeded random order (each appears as
    evenly as the counts allow, the rows going round again if there are more columns); then ``extra``
    more cells are drawn at random from the rest of the grid.
    """
    rng = np.random.default_rng([SUBSET_SEED, len(rows), len(columns), len(cover)])
    cells = max(len(cover), len(columns))
    dealt: list = []
    while len(dealt) < cells:
        dealt += [columns[i] for i in rng.permutation(len(columns))]
    chosen = {(cover[i % len(cover)], dealt[i]) for i in range(cells)}
    rest = [(row, column) for row in rows for column in columns if (row, column) not in chosen]
    chosen |= {rest[i] for i in rng.choice(len(rest), size=min(extra, len(rest)), replace=False)}
    return chosen


def grid(rows: list[str], columns: tuple, default: set[tuple]) -> list:
    """Every cell of ``rows`` x ``columns`` as pytest params; those not in ``default`` marked exhaustive."""
    return [
        pytest.param(row, column, marks=() if (row, column) in default else pytest.mark.exhaustive)
        for row in rows
        for column in columns
    ]


def law_list(default: list[str]) -> list:
    """Every law of LAWS as a pytest param; those not in ``default`` marked exhaustive."""
    return [pytest.param(law, marks=() if law in default else pytest.mark.exhaustive) for law in LAWS]


# --------------------------------------------------------------------------- the audit
@dataclasses.dataclass(frozen=True)
class Truth:
    """Exact privacy of best-of-K for one (pair, law)."""

    rdp: np.ndarray  # max of both directions, on ORDERS
    epsilon: dict  # δ -> exact ε(δ)


@functools.cache
def base_curve(pair: Pair) -> RDPCurve:
    """The pair's exact RDP curve (both directions), rounded up."""
    return RDPCurve(ORDERS, symmetric_renyi(pair.p, pair.q) * BASE_INFLATION)


@functools.cache
def truth(pair: Pair, law: RunCountDistribution) -> Truth:
    """Exact RDP curve and ε(δ) of the best-of-K pair (A, A')."""
    a, b = best_of_k_law(pair.p, law), best_of_k_law(pair.q, law)
    return Truth(symmetric_renyi(a, b), {d: true_epsilon(a, b, d) for d in DELTAS})


def rdp_violations(claimed: np.ndarray, true_rdp: np.ndarray) -> np.ndarray:
    """Indices of ORDERS where a claimed RDP bound is below the truth."""
    return np.flatnonzero(claimed < true_rdp * (1.0 - RTOL) - ATOL)


def epsilon_violated(claimed: float, true_eps: float) -> bool:
    """Whether a claimed ε(δ) is below the exact one."""
    return claimed < true_eps * (1.0 - RTOL) - ATOL


def audit(bound: RDPCurve, pair: Pair, law: RunCountDistribution, label: str) -> list[str]:
    """Every way ``bound`` is below the truth for (pair, law), as readable lines."""
    exact = truth(pair, law)
    claimed = bound.at(ORDERS)
    where = f"{label} bound for K ~ {law!r}, {pair.describe()}"
    lines = [
        f"{where}: RDP at order {ORDERS[i]:.6g} is {float(claimed[i])!r} < true {float(exact.rdp[i])!r}"
        for i in rdp_violations(claimed, exact.rdp)
    ]
    for delta in DELTAS:
        value = bound.epsilon(delta=delta)
        if epsilon_violated(value, exact.epsilon[delta]):
            lines.append(f"{where}: epsilon({delta:g}) is {value!r} < true {exact.epsilon[delta]!r}")
    return lines


def _report(lines: list[str], limit: int = 8) -> str:
    head = "\n".join(lines[:limit])
    return f"{len(lines)} violation(s) of a privacy bound (an OPTIMISTIC bound):\n{head}" + (
        f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
    )


# --------------------------------------------------------------------------- self-checks of the oracle
@pytest.mark.parametrize("law_name", list(LAWS))
def test_exact_pgf_matches_the_library_law(law_name):
    law = LAWS[law_name]
    f = pgf(law)
    for x in (0.0, 0.1, 0.5, 0.9, 0.999, 1.0):
        assert float(f(MP.mpf(x))) == pytest.approx(float(law.pgf(x)), rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("law_name", list(LAWS))
def test_best_of_k_law_is_a_probability_law(law_name):
    law = LAWS[law_name]
    for pair in ALL_PAIRS[::5]:
        output_law = best_of_k_law(pair.p, law)
        assert all(x >= 0 for x in output_law)
        assert abs(MP.fsum(output_law) - 1) < MP.mpf(10) ** -40
        assert float(output_law[0]) == pytest.approx(law.prob_zero, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_best_of_k_law_matches_enumeration_for_a_fixed_k(k):
    """Brute force: the max of k iid draws, summed over all m^k outcomes."""
    pair = PAIRS["far"][2]
    m = len(pair.p)
    direct = [MP.zero] * m
    for draws in itertools.product(range(m), repeat=k):
        direct[max(draws)] += MP.fprod(pair.p[i] for i in draws)
    exact = best_of_k_law(pair.p, PointMass(k))
    assert exact[0] == 0
    assert all(abs(x - y) < MP.mpf(10) ** -40 for x, y in zip(exact[1:], direct))


def test_true_epsilon_is_the_smallest_epsilon_meeting_delta():
    law = LAWS["tnb-eta1-mean10"]
    for pair in ALL_PAIRS[::3]:
        a, b = best_of_k_law(pair.p, law), best_of_k_law(pair.q, law)

        def worst(e, a=a, b=b):
            return max(hockey_stick(a, b, e), hockey_stick(b, a, e))

        for delta in DELTAS:
            eps = true_epsilon(a, b, delta)
            assert worst(eps * (1 + 1e-12) + 1e-15) <= delta
            if eps > 1e-9:
                assert worst(eps * (1 - 1e-9)) > delta


def test_base_curve_is_the_exact_divergence_rounded_up():
    pair = PAIRS["medium"][1]
    forward, backward = renyi_divergences(pair.p, pair.q, MP_ORDERS), renyi_divergences(pair.q, pair.p, MP_ORDERS)
    assert all(mine >= u and mine >= v for mine, u, v in zip(base_curve(pair).epsilons, forward, backward))
    # K = 1 is the base itself: the oracle must give back exactly the base divergences
    np.testing.assert_allclose(truth(pair, PointMass(1)).rdp * BASE_INFLATION, base_curve(pair).epsilons, rtol=1e-15)


# --------------------------------------------------------------------------- the audit proper
@pytest.mark.parametrize(
    ("law_name", "family"), grid(list(LAWS), FAMILIES, default_cases(list(LAWS), FAMILIES, EDGE_LAWS, extra=4))
)
def test_closed_form_bound_is_never_below_the_truth(law_name, family):
    """P&S Thm 2 (TNB), Thm 6 with the RDP-implied δ̂ (Poisson), k·ε (point mass)."""
    law = LAWS[law_name]
    lines = []
    for pair in PAIRS[family]:
        lines += audit(repeat_and_select(base_curve(pair), law), pair, law, "closed-form")
    assert not lines, _report(lines)


@pytest.mark.parametrize(
    ("law_name", "family"), grid(POISSON_LAWS, FAMILIES, default_cases(POISSON_LAWS, FAMILIES, POISSON_LAWS))
)
def test_poisson_bound_with_exact_base_profile_is_never_below_the_truth(law_name, family):
    """P&S Thm 6 with δ̂ from the base's exact hockey-stick profile."""
    law = LAWS[law_name]
    lines = []
    for pair in PAIRS[family]:
        bound = repeat_and_select(base_curve(pair), law, base_delta=exact_profile(pair.p, pair.q))
        lines += audit(bound, pair, law, "Poisson+exact-profile")
    assert not lines, _report(lines)


# The numeric Lemma 7 takes ~0.5 s a call, so each law meets one pair per entry
# point, rotating through the families (5 is coprime to the 36 pairs).
def _rotating_pair(law_name: str, shift: int) -> Pair:
    return ALL_PAIRS[(5 * list(LAWS).index(law_name) + shift) % len(ALL_PAIRS)]


@pytest.mark.parametrize("law_name", law_list(EDGE_LAWS))
def test_generic_lemma_7_bound_is_never_below_the_truth(law_name):
    law, pair = LAWS[law_name], _rotating_pair(law_name, 0)
    lines = audit(generic_repeat_and_select(base_curve(pair), law), pair, law, "generic Lemma 7")
    assert not lines, _report(lines)


@pytest.mark.parametrize("law_name", law_list(EDGE_LAWS))
def test_repeat_and_select_with_generic_is_never_below_the_truth(law_name):
    law, pair = LAWS[law_name], _rotating_pair(law_name, 17)
    lines = audit(repeat_and_select(base_curve(pair), law, generic=True), pair, law, "generic=True")
    assert not lines, _report(lines)


# --------------------------------------------------------------------------- the audit has teeth
@pytest.mark.slow
def test_audit_catches_the_base_curve_claimed_for_best_of_geometric_10():
    """Ignoring the repetition entirely must be flagged, in RDP and in (ε, δ)."""
    law = Geometric.from_mean(10.0)
    rdp_caught = [p.name for p in ALL_PAIRS if rdp_violations(base_curve(p).epsilons, truth(p, law).rdp).size]
    eps_caught = [
        p.name
        for p in ALL_PAIRS
        if any(epsilon_violated(base_curve(p).epsilon(delta=d), truth(p, law).epsilon[d]) for d in DELTAS)
    ]
    assert len(rdp_caught) >= len(ALL_PAIRS) // 2, rdp_caught
    assert len(eps_caught) >= len(ALL_PAIRS) // 2, eps_caught
    # while the real bound for the same law passes on every pair
    for pair in ALL_PAIRS:
        assert not audit(repeat_and_select(base_curve(pair), law), pair, law, "closed-form")


SHRINK_CAUGHT_LAWS = [
    "poisson-3",
    "poisson-10",
    "poisson-50",
    "tnb-eta-0.5-mean2",
    "tnb-eta0-mean2",
    "tnb-eta0.5-mean2",
    "tnb-eta1-mean2",
    "tnb-eta3-mean2",
    "pointmass-1",
    "pointmass-4",
]


@pytest.mark.parametrize("law_name", SHRINK_CAUGHT_LAWS)
def test_audit_catches_the_closed_form_bound_shrunk_by_20_percent(law_name):
    law = LAWS[law_name]
    caught = next(  # the first pair that flags it (one is enough: the audit has teeth)
        (
            pair.name
            for pair in ALL_PAIRS
            if rdp_violations(0.8 * repeat_and_select(base_curve(pair), law).epsilons, truth(pair, law).rdp).size
        ),
        None,
    )
    assert caught is not None, "an RDP bound 20% too small went unnoticed: the audit has no teeth"


@pytest.mark.parametrize("law_name", ["poisson-3", "poisson-50", "tnb-eta1-mean2", "pointmass-1", "pointmass-4"])
def test_audit_catches_epsilon_shrunk_by_20_percent(law_name):
    law = LAWS[law_name]
    caught = next(  # the first pair that flags it (one is enough: the audit has teeth)
        (
            pair.name
            for pair in ALL_PAIRS
            if epsilon_violated(
                0.8 * repeat_and_select(base_curve(pair), law).epsilon(delta=1e-6), truth(pair, law).epsilon[1e-6]
            )
        ),
        None,
    )
    assert caught is not None, "an epsilon(1e-6) 20% too small went unnoticed: the audit has no teeth"


# --------------------------------------------------------------------------- tightness
def _closest_ratio(bound_of: Callable[[Pair], RDPCurve], law: RunCountDistribution, pairs: list[Pair]) -> float:
    """min over pairs and orders of bound / truth (where the truth is > 1e-9)."""
    ratios = []
    for pair in pairs:
        exact = truth(pair, law).rdp
        keep = exact > 1e-9
        ratios.append(np.min(bound_of(pair).at(ORDERS)[keep] / exact[keep]))
    return float(min(ratios))


@pytest.mark.parametrize("law_name", ["poisson-3", "poisson-10", "poisson-50"])
def test_theorem_6_with_exact_profile_is_tight_on_a_rare_top_output(law_name):
    """With one output of tiny probability, D_λ(A‖A') → D_λ(P‖P') + log(μ)/(λ-1): Thm 6 is exact there."""
    law = LAWS[law_name]
    ratio = _closest_ratio(
        lambda pair: repeat_and_select(base_curve(pair), law, base_delta=exact_profile(pair.p, pair.q)),
        law,
        PAIRS["tiny"],
    )
    assert 1.0 - RTOL <= ratio < 1.0 + 1e-6


TNB_LAWS = [name for name in LAWS if name.startswith("tnb")]
TNB_MEANS = ("mean2", "mean10", "mean100")
TNB_SHAPES = [name.rsplit("-", 1)[0] for name in TNB_LAWS[:: len(TNB_MEANS)]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("shape", "mean"), grid(TNB_SHAPES, TNB_MEANS, default_cases(TNB_SHAPES, TNB_MEANS, TNB_SHAPES))
)
def test_theorem_2_is_within_a_factor_of_the_truth_somewhere(shape, mean):
    """On these mechanisms the TNB bound comes within 1.5x of the truth at some order (1.04-1.38 seen)."""
    law = LAWS[f"{shape}-{mean}"]
    ratio = _closest_ratio(lambda pair: repeat_and_select(base_curve(pair), law), law, ALL_PAIRS)
    assert 1.0 - RTOL <= ratio < 1.5, (law, ratio)


@pytest.mark.slow
def test_composition_is_tight_at_high_orders_for_a_point_mass():
    """Best of 4 reaches 4 D_α(P‖P') when the worst likelihood ratio sits on the lowest output."""
    law = LAWS["pointmass-4"]
    ratio = _closest_ratio(lambda pair: repeat_and_select(base_curve(pair), law), law, ALL_PAIRS)
    assert 1.0 - RTOL <= ratio < 1.01


@pytest.mark.slow
def test_point_mass_epsilon_is_within_the_cks_conversion_gap():
    """For K = 1 the bound is the exact base curve: only the RDP → (ε, δ) conversion is lost."""
    for pair in ALL_PAIRS:
        exact = truth(pair, PointMass(1)).epsilon[1e-6]
        claimed = repeat_and_select(base_curve(pair), PointMass(1)).epsilon(delta=1e-6)
        assert exact * (1 - RTOL) <= claimed < 1.5 * exact + 0.05, pair.describe()


@pytest.mark.parametrize("law_name", ["poisson-3", "tnb-eta1-mean2", "tnb-eta0-mean10"])
def test_generic_lemma_7_is_nearly_tight_on_a_rare_top_output(law_name):
    """The certified worst case of Lemma 7 is within 5% of the truth at α = 1001 (0.3-1% seen)."""
    law, pair = LAWS[law_name], PAIRS["tiny"][0]
    ratio = _closest_ratio(lambda p: generic_repeat_and_select(base_curve(p), law), law, [pair])
    assert 1.0 - RTOL <= ratio < 1.05


# --------------------------------------------------------------------------- failed runs
def _with_failures(pair: Pair, fail: tuple) -> Pair:
    """The pair post-processed by "output y fails with probability fail[y]": a new lowest output, 'failed'.

    This is a run that crashes as a function of what it computed; the account covers a trial's
    last attempt whatever its end, and ranks a failed run below every score (release.py).
    """
    p = (MP.fsum(x * MP.mpf(f) for x, f in zip(pair.p, fail)),) + tuple(
        x * (1 - MP.mpf(f)) for x, f in zip(pair.p, fail)
    )
    q = (MP.fsum(x * MP.mpf(f) for x, f in zip(pair.q, fail)),) + tuple(
        x * (1 - MP.mpf(f)) for x, f in zip(pair.q, fail)
    )
    return Pair(f"{pair.name}+failures", p, q)


@pytest.mark.parametrize("law_name", ["poisson-3", "tnb-eta0-mean2"])
def test_a_failed_last_attempt_is_covered_by_the_bound_of_the_run(law_name):
    """Best-of-K over runs that may fail (ranked last) stays within the bound computed for the run itself."""
    law = LAWS[law_name]
    lines = []
    for family in ("medium", "reversed"):
        for pair in PAIRS[family][:2]:
            m = len(pair.p)
            for fail in ((0.5,) * m, tuple(np.linspace(0.9, 0.0, m)), tuple(np.linspace(0.0, 0.9, m))):
                failing = _with_failures(pair, fail)
                lines += audit(repeat_and_select(base_curve(pair), law), failing, law, "failed-run")
    assert not lines, _report(lines)
