"""δ(ε) read off a privacy loss distribution in one pass: dp_accounting's own values, bit for bit."""

import numpy as np
import pytest
from dp_accounting.pld import common, privacy_loss_distribution

from ray_dptune.accounting.curves import pld_reading, profiles

PLDS = [  # (q, σ, steps, discretisation): DP-SGD, a large batch, the plain Gaussian, weak and strong noise
    (0.01, 1.1, 1000, 1e-3),
    (0.16, 0.9, 50, 1e-3),
    (1.0, 2.0, 1, 1e-4),
    (0.001, 0.6, 300, 1e-3),
    (0.5, 5.0, 10, 1e-2),
]


def built(q, sigma, steps, discretization):
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma,
        pessimistic_estimate=True,
        value_discretization_interval=discretization,
        sampling_prob=q,
    )
    return pld.self_compose(steps) if steps > 1 else pld


@pytest.mark.parametrize("setting", PLDS)
def test_every_delta_is_dp_accountings_own_value_in_any_order_of_epsilon(setting):
    pld = built(*setting)
    rng = np.random.default_rng(7)
    epsilons = np.concatenate([[0.0, 1e-9], rng.uniform(0.0, 20.0, 200), np.geomspace(1e-4, 60.0, 80), [700.0]])
    expected = np.asarray(pld.get_delta_for_epsilon(np.sort(epsilons)), dtype=float)
    shuffled = rng.permutation(epsilons)
    got = pld_reading.hockey_stick_deltas(pld, shuffled)
    np.testing.assert_array_equal(got[np.argsort(shuffled)], expected)


def test_a_sparse_distribution_is_read_by_dp_accounting_itself():
    pld = privacy_loss_distribution.from_privacy_parameters(common.DifferentialPrivacyParameters(1.0, 1e-5))
    epsilons = np.array([2.0, 0.0, 0.5, 1.0])
    expected = np.asarray(pld.get_delta_for_epsilon(np.sort(epsilons)), dtype=float)
    np.testing.assert_array_equal(pld_reading.hockey_stick_deltas(pld, epsilons)[np.argsort(epsilons)], expected)
    assert pld_reading.hockey_stick_deltas(pld, np.array([1.0]))[0] == pytest.approx(1e-5)


def test_beyond_the_largest_exponent_delta_is_read_at_it_never_below_the_truth():
    pld = built(0.5, 0.3, 2000, 1e-2)  # losses far above 709: e^ε overflows there
    at_limit = pld_reading.hockey_stick_deltas(pld, np.array([pld_reading.MAX_EXP_ARGUMENT]))[0]
    beyond = pld_reading.hockey_stick_deltas(pld, np.array([800.0, np.inf]))
    assert np.all(beyond == at_limit)  # δ non-increasing in ε: δ(709.78) bounds δ(800) and δ(∞)
    assert at_limit >= pld.get_delta_for_epsilon(np.inf)


def test_the_dpsgd_profile_reads_dp_accountings_values():
    """The profile the selection bounds use gives dp_accounting's values (clipped to [0, 1])."""
    profiles.clear_profile_caches()
    profile = profiles.subsampled_gaussian_profile(
        sample_rate=0.01, noise_multiplier=1.1, steps=1000, discretization=1e-3
    )
    epsilons = np.geomspace(1e-3, 30.0, 300)
    pld = built(0.01, 1.1, 1000, 1e-3)
    np.testing.assert_array_equal(profile(epsilons), np.clip(pld.get_delta_for_epsilon(epsilons), 0.0, 1.0))
