"""DP Bayesian optimisation (Kusner et al. 2015): the release's maths and DPBOSearcher.

Oracles: closed forms of the paper's constants (values from mpmath at 30 digits);
softmax(εμ/(2Δ)) and the exponential mechanism's exact ratio bound e^ε; γ_T by
brute force over every multiset of a tiny Λ; a numpy closed-form GP posterior
(Kusner eq. 2) for the BoTorch model; GP-UCB's argmax recomputed by hand; a
chi-square test of the λ̃ draw; a real Tune run with the accountant callback.
"""

import itertools
import json
import math
import os
import pickle

import numpy as np
import pytest
from ray import tune
from scipy import special, stats

from ray_dptune import PrivacyAccountantCallback, PrivacyError, UnsupportedBoundError, private_tune_config
from ray_dptune.accounting.bounds import dpbo_bounds as vr
from ray_dptune.accounting.bounds import information_gain as ig
from ray_dptune.records.report import REPORT_FILE
from ray_dptune.search.candidates import build_candidate_set
from ray_dptune.search.dpbo import DPBOSearcher, draw_index
from ray_dptune.search.gp import gp_posterior

SPACE = {"C": tune.grid_search([0.1, 1.0, 10.0]), "gamma": tune.grid_search([1e-3, 1e-2])}  # |Λ| = 6
EPS, DELTA = 1.0, 1e-3


def acc(config):
    """A smooth fake validation accuracy, best at C = 10, gamma = 1e-2."""
    return 0.9 - 0.02 * abs(math.log10(config["C"]) - 1) - 0.03 * abs(math.log10(config["gamma"]) + 2)


def drive(searcher, score=acc, start=0, stop=None):
    """suggest/complete until FINISHED (or ``stop`` rounds); returns the suggested configs."""
    configs = []
    for i in itertools.count(start):
        if stop is not None and i >= start + stop:
            break
        config = searcher.suggest(f"t{i}")
        if config == "FINISHED":
            break
        configs.append(config)
        searcher.on_trial_complete(f"t{i}", result={"acc": score(config)})
    return configs


def numpy_posterior(x, y, xs, kernel, lengthscale, noise):
    """Kusner eq. (2): μ = k(λ, X)(K + σ²I)⁻¹y, σ² = 1 − k(λ, X)(K + σ²I)⁻¹k(X, λ)."""
    kx = ig.kernel_matrix(xs, x, kernel=kernel, lengthscale=lengthscale)
    gram = ig.kernel_matrix(x, x, kernel=kernel, lengthscale=lengthscale) + noise * np.eye(len(x))
    return kx @ np.linalg.solve(gram, y), np.sqrt(1.0 - np.einsum("ij,ji->i", kx, np.linalg.solve(gram, kx.T)))


# ---------------------------------------------------------------------------- the maths
def test_exponential_mechanism_is_the_softmax():
    mu, eps, sens = np.array([0.1, 0.7, -0.3, 0.7]), 2.0, 0.25
    expected = special.softmax(eps * mu / (2 * sens))
    np.testing.assert_allclose(vr.exponential_mechanism_probabilities(mu, epsilon=eps, sensitivity=sens), expected)


def test_exponential_mechanism_is_stable_for_large_scores():
    mu = np.array([1e6, 1e6 + 1.0, 1e6 - 2.0])  # exp(ε μ /(2Δ)) overflows without the shift
    p = vr.exponential_mechanism_probabilities(mu, epsilon=10.0, sensitivity=1e-3)
    assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(p, special.softmax(10.0 * (mu - mu.max()) / 2e-3), atol=1e-300)
    p = vr.exponential_mechanism_probabilities(np.array([1.7e308, -1.7e308]), epsilon=1.0, sensitivity=1.0)
    np.testing.assert_array_equal(p, [1.0, 0.0])
    # ε/(2Δ) underflows to 0: the ε → 0 limit, uniform, although the difference is -inf
    p = vr.exponential_mechanism_probabilities(np.array([1.7e308, -1.7e308]), epsilon=1e-300, sensitivity=1e300)
    np.testing.assert_array_equal(p, [0.5, 0.5])


@pytest.mark.parametrize("seed", range(20))
def test_exponential_mechanism_ratio_is_at_most_e_eps(seed):
    """Exact privacy: μ, μ' with |μ − μ'| ≤ Δ everywhere give p(λ)/p'(λ) ≤ e^ε for every λ."""
    rng = np.random.default_rng(seed)
    eps, sens = rng.uniform(0.1, 5.0), rng.uniform(0.01, 3.0)
    mu = rng.normal(0.0, 5.0, size=rng.integers(2, 50))
    shift = rng.uniform(-sens, sens, size=mu.size)
    shift[rng.integers(mu.size)], shift[rng.integers(mu.size)] = sens, -sens
    for other in (mu + shift, mu + np.where(np.arange(mu.size) == 0, sens, -sens)):  # random and extremal
        p = vr.exponential_mechanism_probabilities(mu, epsilon=eps, sensitivity=sens)
        q = vr.exponential_mechanism_probabilities(other, epsilon=eps, sensitivity=sens)
        assert np.max(np.maximum(p / q, q / p)) <= math.exp(eps) * (1 + 1e-12)


def test_beta_and_c_against_hand_computed_values():
    # mpmath, 30 digits: 2 log(64·3²·π²/(3·1e-3)) and 2√(0.05 log(3·64/1e-3))
    assert vr.beta_t(3, 64, delta=1e-3) == pytest.approx(28.9094208454174378964789340649, rel=1e-11)
    assert vr.dataset_shift_bound(0.95, 64, failure=1e-3 / 3) == pytest.approx(
        1.55982374972366147775162401748, rel=1e-11
    )
    assert vr.srinivas_c1(0.01) == pytest.approx(1.73343252268425345445991694291, rel=1e-11)
    assert vr.dataset_shift_bound(1.0, 64, failure=1e-3) == 0.0  # k1 = 1: the datasets' functions coincide
    assert vr.beta_t(3, 64, delta=1e-3) >= 2 * math.log(64 * 9 * math.pi**2 / 3e-3)  # rounded up, never down


def test_algorithm1_constants_against_hand_computed_values():
    args = {"n_candidates": 64, "num_trials": 10, "epsilon": 1.0, "delta": 1e-3, "k1": 0.95, "noise_variance": 0.01}
    both = vr.algorithm1_bounds(**args, gamma_bound=20.0)
    # mpmath: (√(C1 β_T(δ/2) γ/T) + 2√(0.05 log(4·64/δ)) + 2·0.1·√(2 log(8·10/δ)))/ε and 2√β_11(δ/2) + c
    assert both.laplace_scale == pytest.approx(13.5615234728031165284395219646, rel=1e-11)
    assert both.em_sensitivity == pytest.approx(13.4749984682174481178208049754, rel=1e-11)
    assert both.c == pytest.approx(1.55982374972366147775162401748, rel=1e-11)
    config_only = vr.algorithm1_bounds(**args, gamma_bound=20.0, release="config")
    assert config_only.em_sensitivity == pytest.approx(13.2399868961764508686258519434, rel=1e-11)  # β on δ
    paper = vr.paper_algorithm1_laplace_scale(**args, gamma=20.0)
    assert paper == pytest.approx(12.9387405708420015346970933501, rel=1e-11)  # the formula as printed
    half = vr.paper_algorithm1_laplace_scale(**{**args, "epsilon": 0.5}, gamma=20.0)
    assert half == pytest.approx(2 * paper, rel=1e-14)  # ∝ 1/ε
    assert both.laplace_scale > paper  # our union bound adds noise, never removes it


@pytest.mark.parametrize("delta", [1e-1, 1e-6])
@pytest.mark.parametrize("T", [1, 5, 100])
def test_algorithm1_noise_terms_never_below_the_papers(T, delta):
    args = {"n_candidates": 7, "num_trials": T, "epsilon": 0.5, "delta": delta, "k1": 0.5, "noise_variance": 0.3}
    ours = vr.algorithm1_bounds(**args, gamma_bound=3.0)
    assert ours.laplace_scale >= vr.paper_algorithm1_laplace_scale(**args, gamma=3.0)
    assert ours.q_score >= math.sqrt(0.3) * math.sqrt(4 * math.log(3 / delta))
    assert ours.c_score >= ours.c
    # Theorem 1's union bound: Lemma 5.1 at T + 1 for V and V', and c's event, within δ
    assert 2 * 7 * math.exp(-ours.beta_T_plus_1 / 2) + delta / 3 <= delta


def test_algorithm2_is_refused():
    with pytest.raises(UnsupportedBoundError, match="de Freitas"):
        vr.algorithm2_laplace_scale(A=1.0, tau=1.0, d=2)
    with pytest.raises(UnsupportedBoundError, match="de Freitas"):
        DPBOSearcher(5, epsilon=EPS, delta=DELTA, algorithm=2)


def test_algorithm3_scale_against_hand_computed_values():
    args = {"lipschitz": 1.0, "g_star": 1.0, "validation_size": 100, "lambda_min": 0.01, "lambda_max": 1.0}
    assert vr.algorithm3_sensitivity(**args) == pytest.approx(0.99 / 0.01 + 1 / 100, rel=1e-11)  # 99.01
    assert vr.algorithm3_laplace_scale(epsilon=0.5, **args) == pytest.approx(198.02, rel=1e-11)
    assert vr.paper_algorithm3_laplace_scale(epsilon=0.5, **args) == pytest.approx(198.02, rel=1e-11)
    # where the paper's L/(mλ_min) branch would be smaller, we keep g*/m: 2/8 + 1/100 vs 2/8 + 1/200
    args.update(lambda_min=2.0, lambda_max=4.0)
    assert vr.algorithm3_sensitivity(**args) == pytest.approx(0.26, rel=1e-11)
    assert vr.paper_algorithm3_laplace_scale(epsilon=1.0, **args) == pytest.approx(0.255, rel=1e-11)
    # (min{g*/m, L/(mλ_min)} + (λ_max − λ_min)L/(λ_maxλ_min))/ε = (0.01 + 0.5)/0.5, then where ελ_maxλ_min
    # is subnormal: (1e158 + (1e160 − 5e159))/0.5
    assert vr.paper_algorithm3_laplace_scale(epsilon=0.5, **{**args, "lipschitz": 2.0}) == pytest.approx(1.02)
    tiny = {**args, "g_star": 1e160, "lambda_min": 1e-160, "lambda_max": 2e-160}
    assert vr.paper_algorithm3_laplace_scale(epsilon=0.5, **tiny) == pytest.approx(1.02e160, rel=1e-12)
    with pytest.raises(ValueError, match="epsilon"):
        vr.paper_algorithm3_laplace_scale(epsilon=0.0, **args)
    with pytest.raises(ValueError, match="lambda_max"):
        vr.algorithm3_sensitivity(**{**args, "lambda_max": 1.0})


def exact_gamma(kernel, rounds, noise):
    """γ_T by brute force over every multiset of size T."""
    return max(
        ig.information_gain(kernel[np.ix_(a, a)], noise)
        for a in itertools.combinations_with_replacement(range(kernel.shape[0]), rounds)
    )


@pytest.mark.parametrize("T", [1, 2, 3])
@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
@pytest.mark.parametrize("seed", range(5))
def test_gamma_bound_is_above_the_brute_force_maximum(T, kernel, seed):
    rng = np.random.default_rng(seed)
    x = rng.random((6, 2))
    k = ig.kernel_matrix(x, x, kernel=kernel, lengthscale=rng.uniform(0.1, 1.0))
    noise = 10 ** rng.uniform(-2, 0)
    exact, bound = exact_gamma(k, T, noise), ig.max_information_gain_bound(k, T, noise)
    assert exact <= bound <= exact / (1 - 1 / math.e) + 1e-9


def test_gamma_bound_from_points_matches_the_matrix_version():
    x = np.random.default_rng(2).random((1200, 2))  # above 1 000: columns computed on demand
    k = ig.kernel_matrix(x, x, kernel="rbf", lengthscale=0.1)
    by_points = ig.max_information_gain_bound_from_points(x, 6, 0.05, kernel="rbf", lengthscale=0.1)
    error = ig.kernel_entry_error(2)
    assert by_points == pytest.approx(ig.max_information_gain_bound(k, 6, 0.05, entry_error=error), rel=1e-12)
    small = x[:50]
    assert ig.max_information_gain_bound_from_points(small, 4, 0.05, kernel="matern52", lengthscale=0.3) == (
        ig.max_information_gain_bound(
            ig.kernel_matrix(small, small, kernel="matern52", lengthscale=0.3), 4, 0.05, entry_error=error
        )
    )


def test_gamma_bound_without_the_eigenvalue_bound_is_above_the_brute_force_maximum():
    """Past 1 000 points only the greedy bounds remain: 1 001 rows of 3 distinct points, small noise (gains
    above 1 nat), against the brute-force maximum over the distinct points' multisets."""
    x = np.repeat(np.array([[0.1, 0.2], [0.5, 0.9], [0.9, 0.1]]), [334, 334, 333], axis=0)
    distinct = ig.kernel_matrix(x[[0, 334, 668]], x[[0, 334, 668]], kernel="rbf", lengthscale=0.2)
    for rounds in (1, 3):
        bound = ig.max_information_gain_bound_from_points(x, rounds, 0.01, kernel="rbf", lengthscale=0.2)
        assert exact_gamma(distinct, rounds, 0.01) <= bound <= exact_gamma(distinct, rounds, 0.01) / (1 - 1 / math.e)


def test_gamma_inputs_that_are_not_a_kernel_are_refused():
    for bad in (np.ones((2, 3)), np.ones(3), np.ones((0, 0)), np.array([[1.0, np.nan], [np.nan, 1.0]])):
        with pytest.raises(ValueError, match="non-empty square matrix"):
            ig.max_information_gain_bound(bad, 2, 0.1)
    with pytest.raises(ValueError, match="not positive definite"):
        ig.information_gain(np.array([[1.0, 3.0], [3.0, 1.0]]), 1.0)  # det(I + K) = -5


@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
def test_kernel_at_scales_where_distances_overflow(kernel):
    """ℓ and the points near 1e200: the kernel of r/ℓ = 1; points 1e300 apart at ℓ = 1: 0."""
    one = math.exp(-0.5) if kernel == "rbf" else (1 + math.sqrt(5) + 5 / 3) * math.exp(-math.sqrt(5))
    value = ig.kernel_matrix(np.array([[1e200]]), np.array([[2e200]]), kernel=kernel, lengthscale=1e200)
    assert value[0, 0] == pytest.approx(one, rel=1e-12)
    assert ig.kernel_matrix(np.array([[0.0]]), np.array([[1e300]]), kernel=kernel, lengthscale=1.0)[0, 0] == 0.0


def test_gamma_bound_counts_repeated_queries():
    """One point queried T times gains ½ log(1 + T/σ²) > ½ log(1 + 1/σ²): multisets matter."""
    k = np.ones((1, 1))
    assert ig.max_information_gain_bound(k, 4, 0.1) >= 0.5 * math.log(1 + 4 / 0.1)


# ---------------------------------------------------------------------------- the surrogate
@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
def test_botorch_posterior_matches_the_closed_form(kernel):
    rng = np.random.default_rng(1)
    x, xs = rng.random((7, 3)), rng.random((40, 3))
    y = rng.normal(size=7)
    mean, std = gp_posterior(x, y, xs, kernel=kernel, lengthscale=0.4, noise_variance=0.05)
    expected_mean, expected_std = numpy_posterior(x, y, xs, kernel, 0.4, 0.05)
    np.testing.assert_allclose(mean, expected_mean, atol=1e-6)
    np.testing.assert_allclose(std, expected_std, atol=1e-6)


def test_candidate_set_is_the_cartesian_product_and_sobol_points():
    configs, features = build_candidate_set(SPACE, np.random.default_rng(0), 64)
    assert sorted((c["C"], c["gamma"]) for c in configs) == sorted(itertools.product([0.1, 1.0, 10.0], [1e-3, 1e-2]))
    assert features.shape == (6, 2) and features.min() >= 0 and features.max() <= 1
    space = {"lr": tune.loguniform(1e-4, 1e-1), "opt": tune.choice(["sgd", "adam"])}
    configs, features = build_candidate_set(space, np.random.default_rng(0), 16)
    assert len(configs) == 32 and all(1e-4 <= c["lr"] < 1e-1 for c in configs)
    lr = np.array([c["lr"] for c in configs if c["opt"] == "sgd"])
    np.testing.assert_allclose(features[: len(lr), 0], (np.log(lr) + 4 * math.log(10)) / (3 * math.log(10)))


# ---------------------------------------------------------------------------- the searcher without Ray
def make(**kwargs):
    args = {"epsilon": EPS, "delta": DELTA, "metric": "acc", "mode": "max", "space": SPACE, "seed": 0}
    return DPBOSearcher(kwargs.pop("T", 5), **{**args, **kwargs})


def test_ucb_picks_the_argmax_and_waits_while_pending():
    searcher = make(T=5)
    configs, features = searcher.candidates, searcher._features
    observed, values = [], []
    for t in range(1, 6):
        if observed:
            mean, std = numpy_posterior(features[observed], np.array(values), features, "matern52", 0.2, 0.01)
        else:
            mean, std = np.zeros(6), np.ones(6)
        expected = int(np.argmax(mean + math.sqrt(vr.beta_t(t, 6, delta=DELTA / 2)) * std))
        config = searcher.suggest(f"t{t}")
        assert config == configs[expected]
        assert searcher.suggest("other") is None  # one trial at a time
        searcher.on_trial_complete(f"t{t}", result={"acc": acc(config)})
        searcher.on_trial_complete(f"t{t}", result={"acc": 0.0})  # a second completion is ignored
        observed.append(expected)
        values.append(acc(config))
    assert searcher.suggest("t6") == "FINISHED"


def test_release_after_T_trials():
    searcher = make(T=4)
    assert searcher.privacy_details()["release"] is None
    assert len(drive(searcher)) == 4
    details = searcher.privacy_details()
    assert details["release"]["config"] in searcher.candidates
    assert math.isfinite(details["release"]["score"])
    json.dumps(details)  # the report is JSON
    for key in ("n_candidates", "num_trials", "beta_T_plus_1", "c", "em_sensitivity", "laplace_scale", "gamma_T"):
        assert key in details
    assert details["n_candidates"] == 6 and details["num_trials"] == 4
    guarantee = searcher.release_guarantee()
    assert (guarantee["epsilon"], guarantee["delta"]) == (2 * EPS, 2 * DELTA)  # basic composition
    assert guarantee["protects"] == "validation set" and guarantee["algorithm"] == 1
    assert "Assumption 1" in guarantee["assumption"] and "k1 = 0.95" in guarantee["assumption"]
    assert not searcher.accounts_trial({"C": 1.0})


def test_guarantee_is_known_before_the_search():
    searcher = DPBOSearcher(5, epsilon=0.5, delta=1e-4)  # no space yet: Tune passes it later
    assert searcher.release_guarantee()["epsilon"] == 1.0 and searcher.release_guarantee()["delta"] == 2e-4
    assert searcher.privacy_details()["num_candidates"] is None
    searcher.set_search_properties("acc", "max", SPACE, num_samples=-1)
    assert searcher.privacy_details()["n_candidates"] == 6
    with pytest.raises(PrivacyError, match="num_samples=-1"):
        PrivacyAccountantCallback(DPBOSearcher(5, epsilon=0.5, delta=1e-4), delta=1e-3, verbose=False).setup(
            num_samples=3
        )


def test_release_only_the_config_or_only_the_score():
    config_only = make(T=2, release="config")
    drive(config_only)
    assert config_only.privacy_details()["release"]["score"] is None
    assert config_only.release_guarantee()["epsilon"] == EPS
    score_only = make(T=2, release="score")
    drive(score_only)
    assert score_only.privacy_details()["release"]["config"] is None


def test_dp_bo_is_charged_once_per_release():
    searcher = make(T=2)
    accountant = PrivacyAccountantCallback(searcher, delta=0.1, verbose=False)
    assert accountant.guarantee()["epsilon"] == 2 * EPS  # charged from the start: both parts, basic composition
    drive(searcher)
    assert len(accountant.account.releases) == 1
    assert accountant.guarantee()["epsilon"] == searcher.release_guarantee()["epsilon"] == 2 * EPS  # not 4 ε
    assert accountant.guarantee()["delta"] == 2 * DELTA


def test_release_draws_lambda_from_the_exponential_mechanism():
    searcher = make(T=3, epsilon=40.0)  # a large ε separates the candidates' probabilities
    drive(searcher)
    p = searcher.release_probabilities()
    mean, _ = searcher.posterior()
    sens = searcher.privacy_details()["em_sensitivity"]
    np.testing.assert_allclose(p, special.softmax(40.0 * mean / (2 * sens)))
    rng = np.random.default_rng(5)
    counts = np.bincount([draw_index(p, rng) for _ in range(20_000)], minlength=p.size)
    keep = p * 20_000 >= 5
    assert stats.chisquare(counts[keep], p[keep] / p[keep].sum() * counts[keep].sum()).pvalue > 1e-4


def test_mode_min_negates_the_metric():
    up = make(T=3, mode="max")
    down = make(T=3, mode="min")
    assert drive(up) == drive(down, score=lambda c: -acc(c))
    assert down.privacy_details()["release"]["config"] == up.privacy_details()["release"]["config"]
    assert down.privacy_details()["release"]["score"] == pytest.approx(-up.privacy_details()["release"]["score"])


def test_state_pickles_and_restore_continues_identically():
    reference = make(T=5)
    drive(reference)
    searcher = make(T=5)
    drive(searcher, stop=2)
    assert searcher.suggest("t2") is not None  # pending across the save
    state = pickle.loads(pickle.dumps(searcher.get_state()))
    restored = DPBOSearcher(1, epsilon=3.0, delta=0.5)
    restored.set_state(state)
    restored.on_trial_complete("t2", result={"acc": acc(restored._configs[restored._suggested["t2"]["index"]])})
    drive(restored, start=3)
    assert restored.privacy_details()["release"] == reference.privacy_details()["release"]
    assert [i for i, _ in restored._observations] == [i for i, _ in reference._observations]


def test_failed_trial_is_retried_with_the_same_config():
    searcher = make(T=2)
    first = searcher.suggest("a")
    searcher.on_trial_complete("a", error=True)
    assert searcher.suggest("b") == first
    searcher.on_trial_complete("b", result={"other": 1.0})  # no metric: a failure too
    assert searcher.suggest("c") == first
    searcher.on_trial_complete("c", error=True)
    with pytest.raises(PrivacyError, match="failed 3 times"):
        searcher.suggest("d")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"T": 0}, "num_trials"),
        ({"T": 2.5}, "num_trials"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": None}, "delta"),
        ({"k1": 1.5}, "k1"),
        ({"k1": -0.1}, "k1"),
        ({"lengthscale": None}, "fitting kernel hyperparameters"),
        ({"lengthscale": "fit"}, "fitting kernel hyperparameters"),
        ({"noise_variance": 0.0}, "fitting kernel hyperparameters"),
        ({"prior_std": None}, "fitting kernel hyperparameters"),
        ({"kernel": "spectral_mixture"}, "kernel"),
        ({"release": "best_trial"}, "release"),
        ({"mode": "maximise"}, "mode"),
        ({"space": {"C": tune.grid_search([])}}, "empty"),
        ({"space": {"C": tune.choice([]), "g": tune.uniform(0, 1)}}, "empty"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v)),
)
def test_bad_inputs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_algorithm3_releases_a_laplace_score_over_the_l2_weight():
    space = {"lam": tune.grid_search([0.01, 0.1, 1.0]), "solver": "lbfgs"}
    args = {"algorithm": 3, "release": "score", "lipschitz": 1.0, "g_star": 1.0, "validation_size": 200}
    searcher = DPBOSearcher(3, metric="loss", mode="min", space=space, epsilon=1.0, reg_key="lam", seed=0, **args)
    guarantee = searcher.release_guarantee()
    assert (guarantee["epsilon"], guarantee["delta"], guarantee["algorithm"]) == (1.0, 0.0, 3)
    assert "Assumption 2" in guarantee["assumption"]
    details = searcher.privacy_details()
    assert details["laplace_scale"] == pytest.approx(0.99 / 0.01 + 1 / 200, rel=1e-11)
    for i in range(3):
        config = searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", result={"loss": 0.3 + config["lam"]})
    assert searcher.suggest("t3") == "FINISHED"
    assert math.isfinite(searcher.privacy_details()["release"]["score"])
    with pytest.raises(UnsupportedBoundError, match="only the L2 weight"):
        DPBOSearcher(3, space={**space, "solver": tune.choice(["a", "b"])}, epsilon=1.0, reg_key="lam", **args)
    with pytest.raises(UnsupportedBoundError, match="release='score'"):
        DPBOSearcher(3, space=space, epsilon=1.0, reg_key="lam", **{**args, "release": "both"})
    with pytest.raises(ValueError, match="δ = 0"):
        DPBOSearcher(3, space=space, epsilon=1.0, delta=1e-5, reg_key="lam", **args)


# ---------------------------------------------------------------------------- a real Tune run
def dpbo_trainable(config):
    """A non-torch trainable: the 'validation accuracy' of a fixed function of the config."""
    tune.report({"acc": acc(config)})


@pytest.mark.usefixtures("ray_session")
def test_tune_end_to_end(tmp_path):
    from ray_dptune import release_best

    searcher = DPBOSearcher(4, metric="acc", mode="max", epsilon=EPS, delta=DELTA, seed=3)
    callback = PrivacyAccountantCallback(searcher, delta=2 * DELTA, verbose=False)
    tuner = tune.Tuner(
        dpbo_trainable,
        param_space=SPACE,
        tune_config=private_tune_config(searcher),
        run_config=tune.RunConfig(name="dpbo", storage_path=str(tmp_path), callbacks=[callback], verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 4 and not results.errors
    with open(os.path.join(results.experiment_path, REPORT_FILE)) as file:
        report = json.load(file)
    assert report["guarantee"]["epsilon"] == 2 * EPS and report["guarantee"]["delta"] == 2 * DELTA
    assert report["details"]["release"]["config"] in searcher.candidates
    released = release_best(results)
    assert released.config == report["details"]["release"]["config"]
    assert released.score == report["details"]["release"]["score"]
