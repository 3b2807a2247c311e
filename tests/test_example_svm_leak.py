"""examples/svm_leak.py: the non-private leak, the private bound and the plot (a few seconds)."""

import importlib.util
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.accounting.bounds.distributions import Poisson, TruncatedNegativeBinomial

pytest.importorskip("sklearn")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "svm_leak.py"
REPS = 1000


def _load_example():
    spec = importlib.util.spec_from_file_location("svm_leak", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


svm_leak = _load_example()


@pytest.fixture(scope="module")
def default_run():
    """The example's default setting (seed 0), with fewer simulated searches."""
    args = svm_leak.parse_args(["--reps", str(REPS)])
    return args, svm_leak.run(args)


def test_nonprivate_argmax_differs_between_d_and_d_prime(default_run):
    _, res = default_run
    assert res.acc_d.shape == res.acc_d_prime.shape == res.alphas.shape
    choice_d, choice_d_prime = int(np.argmax(res.acc_d)), int(np.argmax(res.acc_d_prime))
    assert choice_d != choice_d_prime
    assert (res.nonprivate_d, res.nonprivate_d_prime) == (choice_d, choice_d_prime)


def test_accuracies_come_from_the_svm_on_each_dataset():
    """Retrains independently: D' is D plus 8 copies of the outlier, and C = α/(2n)."""
    from sklearn.svm import SVC

    data = svm_leak.make_datasets(np.random.default_rng(1), n_train=40, n_val=100)
    assert len(data.y_train_outliers) == len(data.y_train) + 8
    np.testing.assert_array_equal(data.x_train_outliers[-8:], np.tile([7.9, -8.0], (8, 1)))
    assert np.all(data.y_train_outliers[-8:] == -1)
    alphas = [0.05, 5.0]
    got = svm_leak.validation_accuracies(data.x_train_outliers, data.y_train_outliers, data.x_val, data.y_val, alphas)
    n = len(data.y_train_outliers)
    want = [SVC(kernel="linear", C=a / (2 * n)).fit(data.x_train_outliers, data.y_train_outliers) for a in alphas]
    np.testing.assert_allclose(got, [model.score(data.x_val, data.y_val) for model in want])


def test_theoretical_epsilon_is_the_library_bound(default_run):
    args, res = default_run
    expected = repeat_and_select(RDPCurve.gaussian(noise_multiplier=args.sigma), Poisson(args.mean)).epsilon(
        delta=args.delta
    )
    assert res.theoretical_epsilon == pytest.approx(expected, rel=1e-12)
    assert math.isfinite(expected)

    args = svm_leak.parse_args(["--law", "tnb", "--eta", "0.5", "--sigma", "0.7", "--mean", "6", "--reps", "50"])
    law = TruncatedNegativeBinomial.from_mean(eta=0.5, mean=6.0)
    expected = repeat_and_select(RDPCurve.gaussian(noise_multiplier=0.7), law).epsilon(delta=args.delta)
    assert svm_leak.run(args).theoretical_epsilon == pytest.approx(expected, rel=1e-12)


def test_empirical_epsilon_is_below_the_theoretical_epsilon(default_run):
    args, res = default_run
    assert res.counts_d.sum() == res.counts_d_prime.sum() == REPS

    # The estimate on the example's event, recomputed from its counts.
    likely, other = (res.counts_d_prime, res.counts_d) if res.swapped else (res.counts_d, res.counts_d_prime)
    p_hat, q_hat = likely[res.event].sum() / REPS, other[res.event].sum() / REPS
    point = math.log((p_hat - args.delta) / q_hat)
    assert res.point_epsilon == pytest.approx(point)
    assert 0 < res.lower_epsilon <= point <= res.theoretical_epsilon

    # Even the in-sample best of every event over the released α (optimistic) stays below.
    # "none" (K = 0) has probability e^-mean in both worlds and is left out.
    m = len(res.alphas)
    masks = np.array(list(itertools.product([0, 1], repeat=m))[1:], dtype=float)
    freq_d, freq_dp = masks @ res.counts_d[:m] / REPS, masks @ res.counts_d_prime[:m] / REPS
    assert freq_d.min() > 0 and freq_dp.min() > 0
    best = max(
        np.max(np.log(np.maximum(a - args.delta, 1e-300) / b)) for a, b in ((freq_d, freq_dp), (freq_dp, freq_d))
    )
    assert 0 < best <= res.theoretical_epsilon


def test_exact_law_matches_simulation_and_its_epsilon_is_the_hockey_stick(default_run):
    args, res = default_run
    for exact, counts in ((res.exact_d, res.counts_d), (res.exact_d_prime, res.counts_d_prime)):
        assert exact.sum() == pytest.approx(1.0, abs=1e-9)
        spread = 5 * np.sqrt(exact * (1 - exact) / REPS) + 1e-3
        assert np.all(np.abs(counts / REPS - exact) <= spread)

    def hockey_stick(eps):
        p, q = res.exact_d, res.exact_d_prime
        return max(np.maximum(p - math.exp(eps) * q, 0).sum(), np.maximum(q - math.exp(eps) * p, 0).sum())

    assert 0 < res.exact_epsilon <= res.theoretical_epsilon
    assert hockey_stick(res.exact_epsilon) <= args.delta * (1 + 1e-9)
    assert hockey_stick(0.99 * res.exact_epsilon) > args.delta


def test_main_writes_a_png(tmp_path, capsys):
    path = tmp_path / "svm_leak.png"
    assert svm_leak.main(["--reps", "200", "--grid-size", "7", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "Summary" in out and "theoretical ε" in out
