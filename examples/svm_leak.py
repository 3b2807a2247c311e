"""Hyperparameter tuning leaks membership; private selection bounds the leak.

Reproduces the motivating example of Papernot & Steinke (2022), "Hyperparameter
Tuning with Rényi Differential Privacy", Section 2 (P&S below): a soft-margin linear
SVM on two 2-D Gaussian classes, trained on a dataset D and on D' = D + 8 outliers
x_o = (7.9, -8.0) labelled negative. The best hinge-loss weight α (P&S's
hyperparameter) differs between D and D' (at the default seed; at most others too),
so the tuned α *alone* tells an observer whether the outliers were in the training
data (membership inference).

Then the same search is made private with this library: every run of the base
algorithm picks α uniformly from the grid, trains deterministically and releases
its validation accuracy plus Gaussian noise; the number of runs K is random
(Poisson or truncated negative binomial) and only the best run's α is released.
The whole search's (ε, δ) comes from :func:`ray_dptune.accounting.repeat_and_select`,
and a Monte-Carlo audit (plus the exact law of the released α) shows how much of
that budget this pair of datasets really uses.

Usage::

    python examples/svm_leak.py [--plot FILE.png] [--seed N] [--sigma S] [--reps R]

Defaults run in a few seconds; ``--reps``, ``--grid-size`` and ``--n-val`` scale it.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import integrate, stats

from ray_dptune.accounting import RDPCurve, repeat_and_select
from ray_dptune.accounting.bounds.distributions import Poisson, RunCountDistribution, TruncatedNegativeBinomial

# P&S Section 2: class means, unit isotropic covariance, 40 training inputs, 8 outliers.
MU_NEGATIVE = (7.86, -3.36)
MU_POSITIVE = (6.42, -9.17)
OUTLIER = (7.9, -8.0)
N_OUTLIERS = 8

# ------------------------------------------------------------------ privacy model
# Neighbouring relation and sensitivity.
#
# D and D' differ in their *training* data (D' adds the 8 outliers); the validation
# split is held out and the same in both worlds. Training is deterministic and NOT
# private, so adding even one training example may change the model arbitrarily and
# flip every validation prediction: no per-example bound on the validation count holds
# (the "count changes by at most the number of changed examples" argument is only
# valid when the model does not depend on the changed examples). The one bound that
# does hold is the range of the score: a validation accuracy lies in [0, 1], so
#
#     |acc(train(D), V) - acc(train(D'), V)| <= 1   for ANY two datasets D, D'
#
# (this also holds if V itself differs). Each run therefore releases
# acc + N(0, σ²), the Gaussian mechanism with sensitivity 1, i.e. (λ, λ/(2σ²))-RDP
# = RDPCurve.gaussian(σ) with respect to replacing the whole data set. That covers the
# pair (D, D') directly, with no group-privacy factor for the 8 outliers, and a
# fortiori every single-example change. The α of each run is drawn independently of
# the data, and the trained model itself is never released: only the best run's α
# (post-processing of the noisy scores) leaves the search.


@dataclass(frozen=True)
class Datasets:
    """Training data for both worlds and the shared held-out validation split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_train_outliers: np.ndarray
    y_train_outliers: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray


@dataclass(frozen=True)
class Results:
    """Everything main() prints and plots; the test reads it."""

    alphas: np.ndarray
    acc_d: np.ndarray
    acc_d_prime: np.ndarray
    law: RunCountDistribution
    sigma: float
    delta: float
    theoretical_epsilon: float
    exact_epsilon: float
    lower_epsilon: float
    point_epsilon: float
    event: np.ndarray
    swapped: bool
    confidence: float
    counts_d: np.ndarray
    counts_d_prime: np.ndarray
    exact_d: np.ndarray
    exact_d_prime: np.ndarray

    @property
    def nonprivate_d(self) -> int:
        """Grid index that non-private tuning picks on D."""
        return nonprivate_choice(self.acc_d)

    @property
    def nonprivate_d_prime(self) -> int:
        """Grid index that non-private tuning picks on D'."""
        return nonprivate_choice(self.acc_d_prime)


# ------------------------------------------------------------------ data and training
def gaussian_classes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n points, alternating labels -1/+1, from unit Gaussians at P&S's class means."""
    y = np.where(np.arange(n) % 2 == 0, -1, 1)
    means = np.where(y[:, None] < 0, np.asarray(MU_NEGATIVE), np.asarray(MU_POSITIVE))
    return means + rng.standard_normal((n, 2)), y


def make_datasets(rng: np.random.Generator, n_train: int = 40, n_val: int = 200) -> Datasets:
    """D (n_train points), D' = D + 8 outliers at x_o (label -1), and a clean validation split."""
    x_train, y_train = gaussian_classes(rng, n_train)
    x_val, y_val = gaussian_classes(rng, n_val)
    x_out = np.vstack([x_train, np.tile(np.asarray(OUTLIER), (N_OUTLIERS, 1))])
    y_out = np.concatenate([y_train, -np.ones(N_OUTLIERS, dtype=y_train.dtype)])
    return Datasets(x_train, y_train, x_out, y_out, x_val, y_val)


def alpha_grid(size: int = 13, low: float = 1e-2, high: float = 1e2) -> np.ndarray:
    """Log-spaced grid of the hinge-loss weight α."""
    return np.geomspace(low, high, size)


def validation_accuracies(x: np.ndarray, y: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, alphas) -> np.ndarray:
    """Trains one linear SVM per α (deterministic, exact) and returns its validation accuracy.

    P&S minimise the mean over examples of ||w||² + α·max(0, 1 - y(w·x + b)), i.e.
    ||w||² + (α/n)·Σ hinge; half of it is scikit-learn's ½||w||² + C·Σ hinge with
    C = α / (2n). So α weights the hinge loss: a large α means weak regularisation.
    """
    from sklearn.svm import SVC  # scikit-learn comes with gpytorch, a dependency of ray_dptune

    n = len(y)
    return np.array([SVC(kernel="linear", C=a / (2 * n)).fit(x, y).score(x_val, y_val) for a in alphas])


def nonprivate_choice(accuracies: np.ndarray) -> int:
    """Non-private tuning: argmax over the grid (ties go to the smallest α)."""
    return int(np.argmax(accuracies))


# ------------------------------------------------------------------ private selection
def make_law(name: str, mean: float, eta: float = 0.0) -> RunCountDistribution:
    """Law of K: ``poisson`` (mean) or ``tnb`` (truncated negative binomial, η, mean)."""
    if name == "poisson":
        return Poisson(mean)
    if name == "tnb":
        return TruncatedNegativeBinomial.from_mean(eta=eta, mean=mean)
    raise ValueError(f"unknown law {name!r}; use 'poisson' or 'tnb'.")


def theoretical_epsilon(sigma: float, law: RunCountDistribution, delta: float) -> float:
    """ε at δ of the whole search (P&S Thm 2 / Thm 6) for a sensitivity-1 Gaussian score."""
    return repeat_and_select(RDPCurve.gaussian(noise_multiplier=sigma), law).epsilon(delta=delta)


def private_selection(accuracies: np.ndarray, sigma: float, law: RunCountDistribution, rng) -> int:
    """One whole private search; returns the released grid index, or len(grid) when K = 0.

    Training is cached (``accuracies``): only K, each run's α and the noise are random.
    """
    k = law.sample(rng)
    if k == 0:
        return len(accuracies)
    picks = rng.integers(len(accuracies), size=k)
    noisy = accuracies[picks] + sigma * rng.standard_normal(k)
    return int(picks[np.argmax(noisy)])


def simulate(accuracies: np.ndarray, sigma: float, law: RunCountDistribution, reps: int, rng) -> np.ndarray:
    """Released outcomes of ``reps`` independent private searches."""
    return np.array([private_selection(accuracies, sigma, law, rng) for _ in range(reps)])


def exact_choice_law(accuracies: np.ndarray, sigma: float, law: RunCountDistribution) -> np.ndarray:
    """Exact P[released index = j] (last entry: K = 0), by numerical integration.

    A run's noisy score has CDF F(y) = mean_a Φ((y - acc_a)/σ); the best of K i.i.d.
    runs has α_j with probability E[K·∫ φ_j F^{K-1}] / m = ∫ φ_j(y) f'(F(y)) dy / m,
    with f the PGF of K (P&S Lemma 7's proof).
    """
    y = np.linspace(accuracies.min() - 12 * sigma, accuracies.max() + 12 * sigma, 40001)
    densities = stats.norm.pdf((y[None, :] - accuracies[:, None]) / sigma) / sigma
    cdf = stats.norm.cdf((y[None, :] - accuracies[:, None]) / sigma).mean(axis=0)
    per_alpha = integrate.trapezoid(densities * law.pgf_derivative(cdf), y, axis=1) / len(accuracies)
    probabilities = np.append(per_alpha, law.prob_zero)
    if not abs(probabilities.sum() - 1.0) < 1e-6:
        raise ValueError(
            f"σ = {sigma} is too fine for the integration grid (total {probabilities.sum()}); use σ >= 1e-3."
        )
    return probabilities


# ------------------------------------------------------------------ distinguishability
def best_event(p: np.ndarray, q: np.ndarray, delta: float) -> tuple[float, np.ndarray, bool]:
    """The event E and direction maximising log((P(E) - δ)/Q(E)) over both orders of (p, q).

    For discrete laws the maximum, floored at 0, is the exact ε(δ) between them; the
    maximising event is a prefix of the outcomes sorted by likelihood ratio, so only
    prefixes are tried. Returns (ε, outcomes in E, swapped) where ``swapped`` means
    that E is likely under q and unlikely under p; ε is inf when some event has
    P(E) > δ and Q(E) = 0.
    """
    best = (0.0, np.array([], dtype=int), False)
    for a, b, swapped in ((p, q, False), (q, p, True)):
        with np.errstate(divide="ignore", invalid="ignore"):
            order = np.argsort(-np.where(b > 0, a / b, np.inf), kind="stable")
            cum_a, cum_b = np.cumsum(a[order]), np.cumsum(b[order])
            values = np.where(cum_a > delta, np.log((cum_a - delta) / cum_b), -np.inf)
        stop = int(np.argmax(values))
        if values[stop] > best[0]:
            best = (float(values[stop]), order[: stop + 1], swapped)
    return best


def clopper_pearson(successes: int, trials: int, level: float) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds (lower, upper), each failing with probability <= level."""
    lower = 0.0 if successes == 0 else float(stats.beta.ppf(level, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(stats.beta.ppf(1 - level, successes + 1, trials - successes))
    return lower, upper


def log_ratio(p_event: float, q_event: float, delta: float) -> float:
    """log((P(E) - δ)/Q(E)), floored at 0 (inf when Q(E) = 0 < P(E) - δ)."""
    if p_event <= delta or p_event - delta <= q_event:
        return 0.0
    return math.inf if q_event == 0 else math.log((p_event - delta) / q_event)


def event_counts(counts_d, counts_d_prime, event, swapped) -> tuple[int, int, int, int]:
    """(hits, searches) of E in the world where E is likely, then in the other world."""
    a, b = (counts_d_prime, counts_d) if swapped else (counts_d, counts_d_prime)
    return int(a[event].sum()), int(a.sum()), int(b[event].sum()), int(b.sum())


def fixed_event_epsilon(counts_d, counts_d_prime, event, swapped, delta: float) -> float:
    """Point estimate of log((P(E) - δ)/Q(E)) from the frequencies of a fixed event E."""
    hits_p, n_p, hits_q, n_q = event_counts(counts_d, counts_d_prime, event, swapped)
    return log_ratio(hits_p / n_p, hits_q / n_q, delta)


def conservative_epsilon(counts_d, counts_d_prime, event, swapped, delta: float, confidence: float) -> float:
    """A lower bound on the true ε(δ) that holds with probability >= ``confidence``.

    ``event`` must be fixed before sampling (here: the likelihood-ratio event of the
    exact laws), so it is not fitted to the noise of the counts it is evaluated on.
    P(E) is bounded from below and Q(E) from above by Clopper–Pearson, each at
    (1 - confidence)/2. The bound is valid whatever event is passed; a good event
    only makes it tighter.
    """
    level = (1.0 - confidence) / 2.0
    hits_p, n_p, hits_q, n_q = event_counts(counts_d, counts_d_prime, event, swapped)
    p_lo, _ = clopper_pearson(hits_p, n_p, level)
    _, q_hi = clopper_pearson(hits_q, n_q, level)
    return log_ratio(p_lo, q_hi, delta)


# ------------------------------------------------------------------ driver
def parse_args(argv=None) -> argparse.Namespace:
    """Command-line flags (defaults: P&S's setting, a few seconds of work)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plot", metavar="FILE.png", help="write accuracy curves and chosen-α histograms")
    parser.add_argument("--seed", type=int, default=0, help="seed of data, runs and noise (default 0)")
    parser.add_argument("--n-train", type=int, default=40, help="training points in D (P&S: 40)")
    parser.add_argument("--n-val", type=int, default=200, help="held-out validation points")
    parser.add_argument("--grid-size", type=int, default=13, help="α values, log-spaced in [0.01, 100]")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise std of each released accuracy")
    parser.add_argument("--law", choices=("poisson", "tnb"), default="poisson", help="law of K")
    parser.add_argument("--mean", type=float, default=10.0, help="E[K]")
    parser.add_argument("--eta", type=float, default=0.0, help="η of the truncated negative binomial")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of the reported guarantee")
    parser.add_argument("--reps", type=int, default=2000, help="private searches simulated per dataset")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence of the empirical lower bound")
    args = parser.parse_args(argv)
    if not (args.sigma > 0 and args.reps >= 1 and args.grid_size >= 2 and 0 < args.confidence < 1):
        parser.error("need --sigma > 0, --reps >= 1, --grid-size >= 2 and 0 < --confidence < 1")
    return args


def run(args: argparse.Namespace) -> Results:
    """Trains once per α and dataset, then audits the private selection; no printing."""
    data_seed, seed_d, seed_dp = np.random.SeedSequence(args.seed).spawn(3)
    data = make_datasets(np.random.default_rng(data_seed), args.n_train, args.n_val)
    alphas = alpha_grid(args.grid_size)
    acc_d = validation_accuracies(data.x_train, data.y_train, data.x_val, data.y_val, alphas)
    acc_dp = validation_accuracies(data.x_train_outliers, data.y_train_outliers, data.x_val, data.y_val, alphas)

    law = make_law(args.law, args.mean, args.eta)
    # Seeded for reproducibility; a real search draws K and the noise from secure_rng().
    out_d = simulate(acc_d, args.sigma, law, args.reps, np.random.default_rng(seed_d))
    out_dp = simulate(acc_dp, args.sigma, law, args.reps, np.random.default_rng(seed_dp))
    size = len(alphas) + 1
    counts_d, counts_dp = np.bincount(out_d, minlength=size), np.bincount(out_dp, minlength=size)
    exact_d, exact_dp = exact_choice_law(acc_d, args.sigma, law), exact_choice_law(acc_dp, args.sigma, law)
    exact_epsilon, event, swapped = best_event(exact_d, exact_dp, args.delta)
    return Results(
        alphas=alphas,
        acc_d=acc_d,
        acc_d_prime=acc_dp,
        law=law,
        sigma=args.sigma,
        delta=args.delta,
        theoretical_epsilon=theoretical_epsilon(args.sigma, law, args.delta),
        exact_epsilon=exact_epsilon,
        lower_epsilon=conservative_epsilon(counts_d, counts_dp, event, swapped, args.delta, args.confidence),
        point_epsilon=fixed_event_epsilon(counts_d, counts_dp, event, swapped, args.delta),
        event=event,
        swapped=swapped,
        confidence=args.confidence,
        counts_d=counts_d,
        counts_d_prime=counts_dp,
        exact_d=exact_d,
        exact_d_prime=exact_dp,
    )


def outcome_labels(alphas: np.ndarray) -> list[str]:
    """Names of the released outcomes: each α, then 'none' (K = 0)."""
    return [f"{a:.3g}" for a in alphas] + ["none"]


def report_nonprivate(res: Results) -> None:
    """Prints the accuracy curves and the two non-private choices (the leak)."""
    labels = outcome_labels(res.alphas)
    i, j = res.nonprivate_d, res.nonprivate_d_prime
    print("1. Non-private tuning (argmax of validation accuracy over the α grid)")
    print(f"   {'α':>8} {'acc on D':>9} {'acc on D′':>9}")
    for a, x, y in zip(labels, res.acc_d, res.acc_d_prime):
        print(f"   {a:>8} {x:9.3f} {y:9.3f}")
    verdict = "DIFFERENT: the chosen α alone reveals membership" if i != j else "same"
    print(f"   chosen α on D = {labels[i]}, on D′ = D + {N_OUTLIERS} outliers: {labels[j]}  -> {verdict}")


def report_private(res: Results, reps: int) -> None:
    """Prints how often each α was released privately, beside its exact probability."""
    print(f"\n2. Private selection: K ~ {res.law!r}, each run releases acc + N(0, {res.sigma:g}²)")
    print(f"   (sensitivity 1 = range of an accuracy), released: the best run's α; {reps} searches per world")
    print(f"   {'α':>8} {'count D':>8} {'count D′':>9} {'exact P_D':>10} {'exact P_D′':>11}")
    rows = zip(outcome_labels(res.alphas), res.counts_d, res.counts_d_prime, res.exact_d, res.exact_d_prime)
    for label, count_d, count_dp, exact_d, exact_dp in rows:
        print(f"   {label:>8} {count_d:8d} {count_dp:9d} {exact_d:10.4f} {exact_dp:11.4f}")


def report_audit(res: Results) -> None:
    """Prints the distinguishing event and its counts in both worlds."""
    labels = outcome_labels(res.alphas)
    likely, unlikely = ("D′", "D") if res.swapped else ("D", "D′")
    hits_p, n_p, hits_q, n_q = event_counts(res.counts_d, res.counts_d_prime, res.event, res.swapped)
    members = ", ".join(labels[k] for k in sorted(res.event))
    print(f"\n3. Audit: E = {{released α in {members}}}, the likelihood-ratio event of the exact laws")
    print(
        f"   (fixed before sampling). E happened in {hits_p}/{n_p} searches on {likely}, {hits_q}/{n_q} on {unlikely}:"
    )
    print(f"   ε(δ) ≥ log((P_{likely}(E) - δ)/P_{unlikely}(E)).")


def utility(res: Results, exact: np.ndarray, acc: np.ndarray) -> float:
    """Expected validation accuracy of the released α (K = 0 counts as 0.5, a coin flip)."""
    return float(exact[:-1] @ acc + exact[-1] * 0.5)


def summary(res: Results, elapsed: float) -> None:
    """Compact final table."""
    labels = outcome_labels(res.alphas)
    nonprivate_eps = "inf" if res.nonprivate_d != res.nonprivate_d_prime else "0"
    rows = [
        ("non-private: chosen α (D / D′)", f"{labels[res.nonprivate_d]} / {labels[res.nonprivate_d_prime]}"),
        ("non-private: ε of (D, D′) from chosen α", f"{nonprivate_eps} (deterministic)"),
        (f"private: theoretical ε at δ={res.delta:g} (library)", f"{res.theoretical_epsilon:.3f}"),
        ("private: exact ε of released α, this (D, D′)", f"{res.exact_epsilon:.3f}"),
        ("private: empirical ε on E, point estimate", f"{res.point_epsilon:.3f}"),
        (f"private: empirical ε, {res.confidence:.0%} lower bound", f"{res.lower_epsilon:.3f} (E, Clopper–Pearson)"),
        (
            "private: E[val acc of released α] (D / D′)",
            f"{utility(res, res.exact_d, res.acc_d):.3f} / {utility(res, res.exact_d_prime, res.acc_d_prime):.3f}",
        ),
        (
            "non-private: val acc of chosen α (D / D′)",
            f"{res.acc_d[res.nonprivate_d]:.3f} / {res.acc_d_prime[res.nonprivate_d_prime]:.3f}",
        ),
        (
            "exact and empirical <= theoretical",
            str(max(res.point_epsilon, res.lower_epsilon, res.exact_epsilon) <= res.theoretical_epsilon),
        ),
        ("runtime", f"{elapsed:.1f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    print("\nSummary")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def plot(res: Results, path: str) -> None:
    """Accuracy vs α for D and D' (argmax marked) and the chosen-α histograms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for acc, name, style in ((res.acc_d, "D", "o-"), (res.acc_d_prime, f"D′ = D + {N_OUTLIERS} outliers", "s--")):
        (line,) = left.semilogx(res.alphas, acc, style, label=name)
        best = nonprivate_choice(acc)
        left.semilogx(res.alphas[best], acc[best], "*", ms=18, color=line.get_color(), mec="k")
    left.set(xlabel="α (hinge-loss weight)", ylabel="validation accuracy", title="Non-private tuning: ★ = argmax")
    left.legend()

    positions = np.arange(len(res.alphas) + 1)
    reps = res.counts_d.sum()
    right.bar(positions - 0.2, res.counts_d / reps, 0.4, label="chosen under D")
    right.bar(positions + 0.2, res.counts_d_prime / reps, 0.4, label="chosen under D′")
    right.plot(
        np.concatenate([positions - 0.2, positions + 0.2]),
        np.concatenate([res.exact_d, res.exact_d_prime]),
        "k.",
        label="exact probability",
    )
    right.set_xticks(positions, outcome_labels(res.alphas), rotation=60)
    right.set(
        xlabel="released α",
        ylabel="frequency over searches",
        ylim=(0, 1.3 * max(right.get_ylim()[1], 0.01)),
    )
    right.set_title(
        f"Private selection, ε at δ={res.delta:g}: ≤ {res.theoretical_epsilon:.2f} (theory)\n"
        f"= {res.exact_epsilon:.2f} (exact, this pair), ≥ {res.lower_epsilon:.2f} (empirical, {res.confidence:.0%})",
        fontsize=10,
    )
    right.legend(fontsize=8, ncol=3, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    """Runs the demonstration; returns the exit status."""
    start = time.perf_counter()
    args = parse_args(argv)
    res = run(args)
    report_nonprivate(res)
    report_private(res, args.reps)
    report_audit(res)
    if args.plot:
        plot(res, args.plot)
        print(f"\nplot written to {args.plot}")
    summary(res, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
