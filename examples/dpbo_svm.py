"""DP Bayesian optimisation of a kernel SVM: the validation set is private (Kusner et al. 2015).

The setting of Kusner et al.'s §6: tune an RBF-kernel SVM's cost C and kernel width
gamma on a log grid (8×8 = 64 candidates by default). The *training* split is
public; the *validation* split is the private data. Each Ray Tune trial fits
``sklearn.svm.SVC`` on the training split and reports its validation accuracy.
GP-UCB chooses the T trials freely; only the final release is private:

* λ̃ = (C, gamma) drawn by the exponential mechanism on the GP posterior mean
  (Algorithm 1, Theorem 1), and
* ṽ = the best validation accuracy + Laplace noise (Algorithm 1, Theorem 3),

each (ε, δ), together (2ε, 2δ), under Assumption 1 (the accuracies are a GP over
(validation set, hyperparameters) with k1(V, V') ≥ k1; the paper's §6 finds 0.95).
The GP's prior is fixed before any data: here accuracy ≈ 0.75 ± 0.15 a priori.

``--algorithm 3`` tunes the L2 weight λ of a logistic regression instead and releases
only its best validation (sigmoid) loss with Laplace noise (Theorem 7, no GP
assumption, ε-DP): its bound grows with 1/λ_min, so keep λ's range narrow.

Data: scikit-learn's bundled breast-cancer set (569 records; no download).

Run it (~1 minute on 2 cores):

    .venv/bin/python examples/dpbo_svm.py
    .venv/bin/python examples/dpbo_svm.py --trials 30 --grid-size 12 --epsilon 4   # bigger
    .venv/bin/python examples/dpbo_svm.py --algorithm 3
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np
import ray
from ray import tune

from ray_dptune import PrivacyAccountantCallback, private_tune_config, release_best
from ray_dptune.search.dpbo import DPBOSearcher

SPLIT_SEED = 0  # the public/private split is fixed before the search
LIPSCHITZ_SIGMOID = 0.25  # |d/dw sigmoid(-y wᵀx)| ≤ ‖x‖/4 with ‖x‖ = 1


def load_split(unit_norm: bool = False):
    """Breast cancer: 60 % public training split, 40 % private validation split (fixed seed)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler, normalize

    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.4, random_state=SPLIT_SEED, stratify=y)
    scaler = StandardScaler().fit(x_train)  # statistics of the public split only
    x_train, x_val = scaler.transform(x_train), scaler.transform(x_val)
    if unit_norm:  # ‖x‖ = 1 record by record: the losses of Assumption 2 are then Lipschitz in w
        x_train, x_val = normalize(x_train), normalize(x_val)
    return x_train, x_val, y_train, y_val


def svm_trainable(config):
    """Fits SVC(C, gamma) on the public split; reports accuracy on the private validation split."""
    from sklearn.svm import SVC

    x_train, x_val, y_train, y_val = load_split()
    model = SVC(C=config["C"], gamma=config["gamma"]).fit(x_train, y_train)
    tune.report({"val_acc": float(model.score(x_val, y_val))})  # once, at the end: the observation v_t


def logreg_trainable(config):
    """Assumption 2: exact minimiser of (λ/2)‖w‖² + mean logistic loss; reports the mean sigmoid loss."""
    from scipy.special import expit
    from sklearn.linear_model import LogisticRegression

    x_train, x_val, y_train, y_val = load_split(unit_norm=True)
    c = 1.0 / (len(y_train) * config["lam"])  # sklearn: ½‖w‖² + C Σ loss ⇔ λ = 1/(nC)
    model = LogisticRegression(C=c, fit_intercept=False, tol=1e-10, max_iter=10_000).fit(x_train, y_train)
    margin = (2 * y_val - 1) * (x_val @ model.coef_.ravel())
    tune.report({"val_loss": float(expit(-margin).mean())})  # g = sigmoid(-y wᵀx) ∈ [0, 1]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", type=int, choices=(1, 3), default=1, help="1: SVM, GP (default); 3: L2")
    parser.add_argument("--trials", type=int, default=12, help="T, trials GP-UCB runs (default 12)")
    parser.add_argument("--grid-size", type=int, default=8, help="values per hyperparameter (default 8)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="ε of each release (default 1)")
    parser.add_argument("--delta", type=float, default=1e-3, help="δ of each release, algorithm 1 (default 1e-3)")
    parser.add_argument("--k1", type=float, default=0.95, help="k1(V, V') of Assumption 1 (default 0.95, §6)")
    parser.add_argument("--release", choices=("both", "config", "score"), default="both", help="what to release")
    parser.add_argument("--compare", action="store_true", help="also print the NON-private best trial (demo only)")
    parser.add_argument("--storage", default=None, help="experiment folder (default: a temporary one)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the release's draws (default: secure)")
    return parser.parse_args(argv)


def make_search(args: argparse.Namespace, validation_size: int):
    """(trainable, space, searcher) for the chosen algorithm."""
    n = args.grid_size
    if args.algorithm == 1:
        space = {
            "C": tune.grid_search([float(v) for v in np.geomspace(1e-2, 1e3, n)]),
            "gamma": tune.grid_search([float(v) for v in np.geomspace(1e-4, 1e1, n)]),
        }
        searcher = DPBOSearcher(
            args.trials, metric="val_acc", mode="max", epsilon=args.epsilon, delta=args.delta,
            release=args.release, k1=args.k1, kernel="matern52", lengthscale=0.25, noise_variance=0.01,
            prior_mean=0.75, prior_std=0.15, seed=args.seed,
        )  # fmt: skip
        return svm_trainable, space, searcher
    space = {"lam": tune.grid_search([float(v) for v in np.geomspace(0.25, 1.0, n)])}
    searcher = DPBOSearcher(
        args.trials, metric="val_loss", mode="min", epsilon=args.epsilon, algorithm=3,
        release="score", lipschitz=LIPSCHITZ_SIGMOID, g_star=1.0, validation_size=validation_size,
        reg_key="lam", prior_mean=0.3, prior_std=0.2, seed=args.seed,
    )  # fmt: skip
    return logreg_trainable, space, searcher


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    validation_size = len(load_split()[3])
    trainable, space, searcher = make_search(args, validation_size)
    guarantee = searcher.release_guarantee()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    accountant = PrivacyAccountantCallback(searcher, delta=max(guarantee["delta"], 1e-12), verbose=False)
    with tempfile.TemporaryDirectory() as scratch:
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=private_tune_config(searcher),
            run_config=tune.RunConfig(
                name="dpbo_svm", storage_path=args.storage or scratch, callbacks=[accountant], verbose=0
            ),
        )
        results = tuner.fit()
        released = release_best(results)  # the searcher's own (λ̃, ṽ), nothing else
        best = results.get_best_result(metric=searcher.metric, mode=searcher.mode) if args.compare else None
    print_summary(searcher, released, best, validation_size, args)
    return 0


def print_summary(searcher, released, best, validation_size: int, args: argparse.Namespace) -> None:
    details, guarantee = searcher.privacy_details(), searcher.release_guarantee()
    print()
    print(f"Threat model: {searcher.threat_model}.")
    print(f"Private data: the {validation_size} validation records. Assumption: {guarantee['assumption']}.")
    print(f"|Λ| = {details['num_candidates']} candidates, T = {details['num_trials']} trials (GP-UCB, one at a time).")
    if args.algorithm == 1:
        print(
            f"β_(T+1) = {details['beta_T_plus_1']:.3f}, c = {details['c']:.3f}, γ_T ≤ {details['gamma_T']:.3f}; "
            f"exponential-mechanism sensitivity Δ = {details['em_sensitivity_metric_units']:.3f} (accuracy units), "
            f"Laplace scale of ṽ = {details['laplace_scale_metric_units']:.3f}."
        )
    else:
        print(
            f"λ ∈ [{details['lambda_min']:g}, {details['lambda_max']:g}]: sensitivity {details['sensitivity']:.4f}, "
            f"Laplace scale {details['laplace_scale']:.4f} (loss units)."
        )
    print()
    if released.config:
        print("Released λ̃: " + ", ".join(f"{k} = {v:.4g}" for k, v in released.config.items()))
    if released.score is not None:
        print(f"Released ṽ ({searcher.metric}): {released.score:.4f}")
    print(
        f"Guarantee of the release: (ε = {guarantee['epsilon']:g}, δ = {guarantee['delta']:g}) for the validation set "
        f"({' and '.join(guarantee['released'])}; {guarantee['theorems']})."
    )
    print(
        "Not covered: the T trials' configurations and scores Ray keeps on disk (release_best(purge=True) deletes them)."
    )
    if best is not None:
        shown = ", ".join(f"{k} = {v:.4g}" for k, v in best.config.items())
        print(
            f"[NOT private, for comparison only] best trial: {shown}, {searcher.metric} = {best.metrics[searcher.metric]:.4f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
