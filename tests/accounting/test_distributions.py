"""Laws of the number of runs: pmf, PGF, utility, exact sampling, validation."""

import math

import numpy as np
import pytest
from scipy import stats

from ray_dptune.accounting.bounds import distributions as d
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
    distribution_from_dict,
    secure_rng,
)

LAWS = {
    "poisson-0.7": Poisson(0.7),
    "poisson-8": Poisson(8.0),
    "tnb-neg0.5": TruncatedNegativeBinomial(-0.5, 0.2),
    "tnb-neg0.9": TruncatedNegativeBinomial(-0.9, 0.3),
    "logarithmic": Logarithmic(0.05),
    "tnb-0.5": TruncatedNegativeBinomial(0.5, 0.1),
    "geometric": Geometric(0.15),
    "tnb-3": TruncatedNegativeBinomial(3.0, 0.4),
    "point-3": PointMass(3),
}
K = np.arange(0, 20000)


class UniformOneToThree(RunCountDistribution):
    """A law a user might write (K uniform on {1, 2, 3}): the contract holds for it too."""

    mean = 2.0

    def pmf(self, k):
        k = np.asarray(k, dtype=float)
        return np.where(np.isin(k, [1.0, 2.0, 3.0]), 1 / 3, 0.0)

    def pgf(self, x):
        x = np.asarray(x, dtype=float)
        return (x + x**2 + x**3) / 3

    def log_pgf_derivative(self, x):
        x = np.asarray(x, dtype=float)
        return np.log((1 + 2 * x + 3 * x**2) / 3)

    def sample(self, rng=None):
        return 1 + int(secure_rng(rng).integers(3))

    def to_dict(self):
        return {"law": "uniform_one_to_three"}


@pytest.fixture(params=[*LAWS.values(), UniformOneToThree()], ids=[*LAWS, "user-law"])
def law(request):
    return request.param


class TestLawContract:
    """What every law of K — ours or a user's subclass of RunCountDistribution — must satisfy."""

    def test_pmf_sums_to_one_and_matches_mean(self, law):
        pmf = law.pmf(K)
        assert pmf.sum() == pytest.approx(1.0, abs=1e-9)
        assert (pmf * K).sum() == pytest.approx(law.mean, rel=1e-8)

    @pytest.mark.parametrize("x", [0.0, 0.3, 0.9, 0.999])
    def test_pgf_and_derivative_match_the_series(self, law, x):
        pmf = law.pmf(K)
        assert float(law.pgf(x)) == pytest.approx((pmf * x**K).sum(), rel=1e-9, abs=1e-15)
        series = (pmf[1:] * K[1:] * x ** (K[1:] - 1)).sum()
        assert float(law.pgf_derivative(x)) == pytest.approx(series, rel=1e-8, abs=1e-15)

    def test_pgf_derivative_at_one_is_the_mean(self, law):
        assert float(law.pgf_derivative(1.0)) == pytest.approx(law.mean, rel=1e-12)
        assert float(law.pgf(1.0)) == pytest.approx(1.0, rel=1e-12)

    def test_expected_quantile_is_e_k_over_k_plus_one(self, law):
        direct = (law.pmf(K) * K / (K + 1.0)).sum()
        assert law.expected_quantile() == pytest.approx(direct, rel=1e-7)

    def test_success_probability(self, law):
        p = 0.01
        direct = (law.pmf(K) * (1 - (1 - p) ** K)).sum()
        assert law.success_probability(p) == pytest.approx(direct, rel=1e-9)
        assert law.success_probability(0.0) == pytest.approx(0.0, abs=1e-15)
        assert law.success_probability(1.0) == pytest.approx(1.0 - law.prob_zero)
        with pytest.raises(ValueError, match="probability"):
            law.success_probability(1.5)

    def test_samples_lie_in_the_support_and_a_seed_reproduces_them(self, law):
        draws = [law.sample(np.random.default_rng(seed)) for seed in range(200)]
        assert all(isinstance(k, int) and law.pmf(k) > 0 for k in draws)
        assert draws == [law.sample(np.random.default_rng(seed)) for seed in range(200)]

    def test_prob_zero_is_the_mass_at_zero(self, law):
        assert law.prob_zero == pytest.approx(float(law.pmf(0)), abs=1e-15)


def test_closed_form_pmfs_of_definition_1():
    gamma = 0.2
    k = np.arange(1, 30)
    np.testing.assert_allclose(Logarithmic(gamma).pmf(k), (1 - gamma) ** k / (k * math.log(1 / gamma)), rtol=1e-12)
    np.testing.assert_allclose(Geometric(gamma).pmf(k), gamma * (1 - gamma) ** (k - 1), rtol=1e-12)
    # Equation (3) as a product, for a negative η.
    eta = -0.4
    law = TruncatedNegativeBinomial(eta, gamma)
    for kk in (1, 2, 7):
        product = np.prod([(l + eta) / (l + 1) for l in range(kk)])
        assert law.pmf(kk) == pytest.approx((1 - gamma) ** kk / (gamma**-eta - 1) * product, rel=1e-12)
    assert law.pmf(0) == 0.0 and law.pmf(2.5) == 0.0


@pytest.mark.parametrize("eta", [-0.7, 0.0, 0.5, 1.0, 4.0])
@pytest.mark.parametrize("mean", [1.5, 10.0, 1000.0])
def test_from_mean_never_exceeds_the_requested_mean(eta, mean):
    law = TruncatedNegativeBinomial.from_mean(eta, mean)
    assert law.mean <= mean
    assert law.mean == pytest.approx(mean, rel=1e-9)
    assert law.eta == eta


def test_named_laws_from_mean():
    assert Geometric.from_mean(10).gamma == pytest.approx(0.1, rel=1e-12)
    assert Geometric.from_mean(10).eta == 1.0
    assert isinstance(Logarithmic.from_mean(10), Logarithmic)
    assert Logarithmic.from_mean(10).eta == 0.0  # the shape asked for, not only the mean
    assert Logarithmic.from_mean(10).mean == pytest.approx(10, rel=1e-9)


def test_expected_quantile_closed_forms():
    assert Poisson(10).expected_quantile() == pytest.approx(1 - (1 - math.exp(-10)) / 10, rel=1e-14)
    assert PointMass(4).expected_quantile() == pytest.approx(0.8)
    # Geometric: f(x) = γx/(1 − ax), a = 1 − γ, so ∫₀¹ f = −γ/a − γ log(γ)/a².
    gamma = 0.1
    a = 1 - gamma
    assert Geometric(gamma).expected_quantile() == pytest.approx(
        1 + gamma / a + gamma * math.log(gamma) / a**2, rel=1e-13
    )


def test_equality_and_hash_follow_the_parameters():
    assert Poisson(10) == Poisson(10) and hash(Poisson(10)) == hash(Poisson(10))
    assert Poisson(10) != Poisson(11)
    assert Geometric(0.1) != TruncatedNegativeBinomial(1.0, 0.1)  # same numbers, another class


def _chi_square_pvalue(law, samples):
    """Pearson test with the tail merged so every bin expects >= 5 samples."""
    n = len(samples)
    top = int(np.max(samples)) + 1
    expected = law.pmf(np.arange(top)) * n
    observed = np.bincount(samples, minlength=top).astype(float)
    last = int(np.nonzero(expected >= 5)[0].max())
    exp_bins = np.append(expected[: last + 1], n - expected[: last + 1].sum())
    obs_bins = np.append(observed[: last + 1], n - observed[: last + 1].sum())
    keep = exp_bins > 0
    assert obs_bins[~keep].sum() == 0, "samples outside the support"
    return stats.chisquare(obs_bins[keep], exp_bins[keep] * obs_bins[keep].sum() / exp_bins[keep].sum()).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in LAWS if not n.startswith("point")])
def test_sampling_is_exact_goodness_of_fit(name):
    law = LAWS[name]
    rng = np.random.default_rng(20261121)
    samples = np.array([law.sample(rng) for _ in range(20000)])
    assert _chi_square_pvalue(law, samples) > 1e-3
    assert samples.mean() == pytest.approx(law.mean, rel=0.1)


def test_goodness_of_fit_test_detects_a_wrong_sampler():
    rng = np.random.default_rng(1)
    wrong = np.array([Geometric(0.17).sample(rng) for _ in range(20000)])
    assert _chi_square_pvalue(Geometric(0.15), wrong) < 1e-6


def test_default_sampling_is_seeded_from_the_secure_source(monkeypatch):
    calls = []
    real = d.secrets.randbits

    def spy(bits):
        calls.append(bits)
        return real(bits)

    monkeypatch.setattr(d.secrets, "randbits", spy)
    Poisson(5).sample()
    TruncatedNegativeBinomial(0.5, 0.1).sample()
    assert calls == [128, 128]


def test_explicit_seed_reproduces():
    law = TruncatedNegativeBinomial(-0.5, 0.05)
    assert [law.sample(7) for _ in range(3)] == [law.sample(7)] * 3
    assert secure_rng(3).integers(1 << 30) == np.random.default_rng(3).integers(1 << 30)
    with pytest.raises(ValueError, match="seed"):
        secure_rng("abc")


def test_large_eta_with_fixed_mean_approaches_poisson():
    """P&S Sec. 3.4: as η → ∞ at fixed mean, the negative binomial becomes Poisson."""
    k = np.arange(0, 200)
    target = Poisson(10).pmf(k)
    distances = []
    for eta in (10.0, 100.0, 1000.0):
        tnb = TruncatedNegativeBinomial.from_mean(eta, 10.0)
        distances.append(0.5 * np.abs(tnb.pmf(k) - target).sum())
    # The variance μ + μ²/η approaches μ: the distance shrinks like 1/η.
    assert distances[0] > 5 * distances[1] > 25 * distances[2]
    assert distances[2] < 5e-3


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TruncatedNegativeBinomial(-1.0, 0.5), "eta must be > -1"),
        (lambda: TruncatedNegativeBinomial(0.5, 1.0), "gamma"),
        (lambda: TruncatedNegativeBinomial(0.5, 0.0), "gamma"),
        (lambda: TruncatedNegativeBinomial(float("nan"), 0.5), "finite"),
        (lambda: Logarithmic(float("inf")), "finite"),
        (lambda: TruncatedNegativeBinomial.from_mean(0.5, 1.0), "mean > 1"),
        (lambda: Geometric.from_mean(0.5), "mean > 1"),
        (lambda: Poisson(0.0), "> 0"),
        (lambda: Poisson(float("nan")), "finite"),
        (lambda: PointMass(0), "k >= 1"),
        (lambda: PointMass(2.5), "integer"),
        (lambda: distribution_from_dict({"law": "uniform"}), "Unknown law"),
    ],
)
def test_invalid_parameters_raise_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("name", LAWS)
def test_dict_round_trip(name):
    law = LAWS[name]
    again = distribution_from_dict(law.to_dict())
    assert again == law and type(again) is type(law)
    assert repr(law).startswith(type(law).__name__)
