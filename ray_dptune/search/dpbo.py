"""DP Bayesian optimisation (Kusner et al. 2015): GP-UCB on a finite Λ, private final release.

Threat model (unlike the rest of the package): the training data are public and
the *validation* set is private. GP-UCB (Srinivas et al. 2010) explores freely over a
finite candidate set Λ; only the final release is differentially private:

* λ̃ ~ exponential mechanism on the posterior mean μ_T (Algorithm 1, Theorem 1);
* ṽ = the best observed gain + Laplace noise (Algorithm 1, Theorem 3; or
  Algorithm 3, Theorem 7, without the GP assumption).

The maths (β_t, c, C1, γ_T, the noise scales, and where it departs from the paper
towards more noise) lives in :mod:`ray_dptune.accounting.validation_release`.

The surrogate's hyperparameters are FIXED before any data: kernel (RBF or Matérn-5/2),
lengthscale ℓ on the unit-cube coordinates, k2(λ, λ) = 1, noise variance σ², prior mean
and std (a data-independent affine map of the metric). Fitting them to validation
scores would make the surrogate depend on the data outside Assumption 1's proof, so
nothing is fitted. Λ: grid_search/choice values form a cartesian product; numeric
domains contribute ``num_candidates`` scrambled-Sobol points (log scale for log
domains; :mod:`ray_dptune.search.candidates` maps them), drawn once, before any trial.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import numbers
from typing import Any, Literal

import numpy as np
from ray.tune.search import Searcher
from ray.tune.search.variant_generator import assign_value

from ray_dptune.accounting import validation_release as vr
from ray_dptune.accounting.account import Mechanism
from ray_dptune.distributions import secure_rng
from ray_dptune.errors import PrivacyError, UnsupportedBoundError
from ray_dptune.search.base import PrivateSearcher
from ray_dptune.search.candidates import _axes, _combos, _features, _sobol
from ray_dptune.search.dphypo import _single_thread

__all__ = [
    "DEFAULT_LENGTHSCALE",
    "DEFAULT_NOISE_VARIANCE",
    "DPBOSearcher",
    "build_candidate_set",
    "draw_index",
    "gp_posterior",
]

logger = logging.getLogger(__name__)

DEFAULT_LENGTHSCALE = 0.2  # on the unit cube of the candidates' coordinates
DEFAULT_NOISE_VARIANCE = 0.01  # σ² in GP units (prior variance 1)
EXPLORATION_DELTA = 0.1  # δ of β_t when it does not enter the privacy proof (Algorithm 3)
MAX_CANDIDATES = 20_000
MAX_FAILURES = 3  # failed attempts of one step before the search stops
_NO_SPACE = "DPBOSearcher has no search space: pass `space=` to it or `param_space=` to tune.Tuner."
_NO_METRIC = "DPBOSearcher needs a metric and a mode ('max' or 'min'): pass them to it or to tune.TuneConfig."
_FIXED = (
    "{name} must be a fixed positive number chosen before seeing any data, got {value!r}: fitting kernel "
    "hyperparameters to validation scores makes the surrogate depend on the private data outside Kusner et al.'s proof."
)


def build_candidate_set(space: dict, rng: np.random.Generator, num_candidates: int) -> tuple[list[dict], np.ndarray]:
    """Λ of a Tune space: configurations and their unit-cube coordinates, drawn without data.

    grid_search and choice values form a cartesian product; the numeric domains get
    ``num_candidates`` scrambled Sobol points (from ``rng``) crossed with it;
    ``sample_from`` values are resolved once per candidate. Duplicates are dropped.

    Returns:
        (configs, features): n configurations and an (n, k) array in [0, 1].

    Raises:
        ValueError: an empty Λ, an unbounded domain, or more than ``MAX_CANDIDATES``.
    """
    numeric, discrete, functions = _axes(space)
    combos = _combos(discrete)
    if combos.shape[0] == 0 or any(len(axis.values) == 0 for axis in discrete):
        raise ValueError("The search space has an empty grid_search or choice: the candidate set Λ is empty.")
    u = _sobol(len(numeric), num_candidates, rng) if numeric else np.zeros((1, 0))
    if combos.shape[0] * u.shape[0] > MAX_CANDIDATES:
        raise ValueError(f"Λ would hold {combos.shape[0] * u.shape[0]} candidates, above {MAX_CANDIDATES}; coarsen it.")
    configs, rows, seen = [], [], set()
    for combo in combos:
        features = _features(numeric, discrete, u, np.tile(combo, (u.shape[0], 1)))
        for point, row in zip(u, features):
            config = copy.deepcopy(space)
            for axis, t in zip(numeric, point):
                assign_value(config, axis.path, axis.value(float(t)))
            for axis, index in zip(discrete, combo):
                value = axis.values[index]
                assign_value(config, axis.path, value.item() if isinstance(value, np.generic) else value)
            for path, domain in functions:
                value = domain.sample(config=config, random_state=rng)
                assign_value(config, path, value.item() if isinstance(value, np.generic) else value)
            key = json.dumps(config, sort_keys=True, default=repr)
            if key not in seen:
                seen.add(key)
                configs.append(config)
                rows.append(row)
    return configs, np.asarray(rows, dtype=float).reshape(len(configs), -1)


def gp_posterior(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    *,
    kernel: vr.KernelName,
    lengthscale: float,
    noise_variance: float,
) -> tuple[np.ndarray, np.ndarray]:
    """μ_t and σ_t of GP(0, k2) + N(0, σ²) noise (Kusner eq. 2) with fixed hyperparameters.

    A BoTorch ``SingleTaskGP`` with a zero mean, a k2(λ, λ) = 1 kernel of fixed
    lengthscale, the fixed noise σ², no outcome or input transform and every
    parameter frozen; exact Cholesky algebra in float64 (no CG or fast variances).

    Args:
        train_x: (t, k) observed inputs. train_y: (t,) observations. test_x: (n, k).

    Returns:
        (mean, std), two (n,) arrays.
    """
    test_x = np.asarray(test_x, dtype=float)
    if len(train_y) == 0:
        return np.zeros(test_x.shape[0]), np.ones(test_x.shape[0])
    import gpytorch
    import torch
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import MaternKernel, RBFKernel
    from gpytorch.means import ZeroMean

    with _single_thread(torch):
        x = torch.as_tensor(np.asarray(train_x, dtype=float), dtype=torch.float64)
        y = torch.as_tensor(np.asarray(train_y, dtype=float), dtype=torch.float64).reshape(-1, 1)
        covar = {"rbf": RBFKernel, "matern52": lambda: MaternKernel(nu=2.5)}[kernel]()
        covar = covar.to(torch.float64)
        covar.lengthscale = float(lengthscale)
        model = SingleTaskGP(
            x,
            y,
            train_Yvar=torch.full_like(y, float(noise_variance)),
            covar_module=covar,
            mean_module=ZeroMean(),
            outcome_transform=None,
            input_transform=None,
        )
        model.requires_grad_(False)
        model.eval()
        exact = gpytorch.settings.fast_computations(covar_root_decomposition=False, log_prob=False, solves=False)
        with torch.no_grad(), exact, gpytorch.settings.max_cholesky_size(10**9), gpytorch.settings.fast_pred_var(False):
            posterior = model.posterior(torch.as_tensor(test_x, dtype=torch.float64).unsqueeze(-2))  # n × (q = 1)
            mean = posterior.mean.reshape(-1).numpy().astype(float)
            var = posterior.variance.reshape(-1).numpy().astype(float)
    return mean, np.sqrt(np.clip(var, 0.0, None))


def draw_index(probabilities: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn with ``probabilities`` (inverse CDF of one uniform from ``rng``)."""
    cdf = np.cumsum(probabilities)
    return min(int(np.searchsorted(cdf / cdf[-1], rng.random(), side="right")), cdf.size - 1)


def _fixed(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
        raise ValueError(_FIXED.format(name=name, value=value))
    return float(value)


class DPBOSearcher(PrivateSearcher):
    """Differentially private Bayesian optimisation (Kusner et al. 2015) for Ray Tune.

    Runs GP-UCB, λ_t = argmax_Λ μ_{t−1} + √β_t σ_{t−1} with β_t = 2 log(|Λ|t²π²/(3δ_β)),
    one trial at a time (``suggest`` returns None while one is pending), for T =
    ``num_trials`` completed trials, then releases privately and returns ``FINISHED``:

    * ``algorithm=1`` (Assumption 1, noisy observations): λ̃ by the exponential
      mechanism on μ_T with Δ = 2√β_{T+1} + c, c = 2√((1 − k1) log(3|Λ|/δ)) (Theorem 1),
      and/or ṽ = max_t v_t + Laplace (Theorem 3, union bound redone). Each is (ε, δ);
      both are (2ε, 2δ) by basic composition (Kusner, after Theorem 4).
    * ``algorithm=3`` (Assumption 2, no GP assumption): ṽ only, Laplace of scale
      ((λ_max − λ_min)L/(λ_maxλ_min) + g*/m)/ε (Theorem 7), ε-DP; λ = config[reg_key].
    * ``algorithm=2`` (noise-free, Theorem 5) raises UnsupportedBoundError: its
      constants are not computable (:func:`~ray_dptune.accounting.validation_release.algorithm2_laplace_scale`).

    The guarantee is Kusner's: it holds under the stated assumption, and δ includes
    the probability (over the GP prior and the observation noise) that the
    sensitivity bound fails. Only the release is private, not the T trials.

    The metric is the trial's last reported validation gain (report it once, when
    the model is final); ``mode="min"`` negates it. The draws (Λ's Sobol points, λ̃, ṽ) use a generator seeded from the OS's secure
    source unless ``seed`` is given. The trials need not report ``dp_plan``: the
    training data are public here. A failed trial is retried with the same λ_t
    (failures must not depend on the validation data); ``MAX_FAILURES`` in a row stop
    the search with PrivacyError.

    Args:
        num_trials: T ≥ 1.
        metric, mode: the validation gain and 'max'/'min' (or from ``tune.TuneConfig``).
        space: the Tune search space (or ``param_space`` of the Tuner).
        epsilon: ε > 0 of each release. delta: δ ∈ (0, 1) of each release (algorithm 1);
            None or 0 for algorithm 3.
        algorithm: 1 or 3 (2 raises). release: "both", "config" (λ̃) or "score" (ṽ).
        k1: k1(V, V') ∈ [0, 1], a lower bound over neighbouring validation sets (§6: 0.95).
        kernel, lengthscale, noise_variance: the fixed k2 and σ² (GP units).
        prior_mean, prior_std: fixed affine map: (metric − prior_mean)/prior_std ~ GP(0, k2).
        num_candidates: Sobol points for the numeric domains (per discrete combination).
        lipschitz, g_star, validation_size, reg_key: L, g*, m and the config key of λ
            (the L2 weight of eq. 10) for algorithm 3.
        seed: for tests and reproducibility; None draws from the OS's secure source.

    Example:
        >>> from ray import tune
        >>> from ray_dptune import PrivacyAccountantCallback, private_tune_config
        >>> space = {"C": tune.grid_search([0.1, 1.0, 10.0]), "gamma": tune.grid_search([1e-3, 1e-2])}
        >>> searcher = DPBOSearcher(12, metric="val_acc", mode="max", epsilon=1.0, delta=1e-3)
        >>> callback = PrivacyAccountantCallback(searcher, delta=2e-3)  # λ̃ and ṽ: (2ε, 2δ)
        >>> tuner = tune.Tuner(lambda config: tune.report({"val_acc": 0.9}), param_space=space,
        ...                    tune_config=private_tune_config(searcher),
        ...                    run_config=tune.RunConfig(callbacks=[callback]))
    """

    threat_model = (
        "validation set: the training data are public; GP-UCB explores freely and only the final release "
        "(λ̃ by the exponential mechanism, ṽ with Laplace noise) is differentially private with respect to "
        "swapping one validation record, under the assumption stated with the guarantee (Kusner et al. 2015)"
    )
    coverage = (
        "The guarantee covers the searcher's own release only: details['release'] = {config: λ̃, score: ṽ} "
        "(None for a part not released). The T configurations GP-UCB tried and their validation scores depend on "
        "the validation set and are NOT covered: Ray keeps them on disk and this report withholds them "
        "(release_best(..., purge=True) deletes the trials' folders). No "
        "checkpoint is released: retrain with λ̃ on the public training data."
    )
    configs_public = False  # GP-UCB picks them from raw validation scores

    def __init__(
        self,
        num_trials: int,
        metric: str | None = None,
        mode: str | None = None,
        space: dict[str, Any] | None = None,
        *,
        epsilon: float,
        delta: float | None = None,
        algorithm: Literal[1, 2, 3] = 1,
        release: vr.Release = "both",
        k1: float = vr.DEFAULT_K1,
        kernel: vr.KernelName = "matern52",
        lengthscale: float = DEFAULT_LENGTHSCALE,
        noise_variance: float = DEFAULT_NOISE_VARIANCE,
        prior_mean: float = 0.0,
        prior_std: float = 1.0,
        num_candidates: int = 64,
        lipschitz: float | None = None,
        g_star: float | None = None,
        validation_size: int | None = None,
        reg_key: str | None = None,
        seed: int | None = None,
    ):
        if isinstance(num_trials, bool) or not isinstance(num_trials, numbers.Integral) or num_trials < 1:
            raise ValueError(f"num_trials = T must be an int >= 1, got {num_trials!r}.")
        if algorithm == 2:
            vr.algorithm2_laplace_scale()
        if algorithm not in (1, 3):
            raise ValueError(f"algorithm must be 1 or 3 (Kusner et al. 2015; 2 is refused), got {algorithm!r}.")
        if mode not in (None, "max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
        if release not in ("both", "config", "score"):
            raise ValueError(f"release must be 'both', 'config' (λ̃) or 'score' (ṽ), got {release!r}.")
        if kernel not in ("rbf", "matern52"):
            raise ValueError(f"kernel must be 'rbf' or 'matern52' (known γ_T bounds, Srinivas 2010), got {kernel!r}.")
        if isinstance(num_candidates, bool) or not isinstance(num_candidates, numbers.Integral) or num_candidates < 1:
            raise ValueError(f"num_candidates must be an int >= 1, got {num_candidates!r}.")
        if not (isinstance(prior_mean, numbers.Real) and math.isfinite(prior_mean)):
            raise ValueError(f"prior_mean must be a fixed finite number, got {prior_mean!r}.")
        super().__init__(metric=metric, mode=mode)
        settings = {
            "algorithm": int(algorithm),
            "epsilon": vr.check_positive("epsilon", epsilon),
            "release": release,
            "kernel": kernel,
            "lengthscale": _fixed("lengthscale", lengthscale),
            "noise_variance": _fixed("noise_variance", noise_variance),
            "prior_mean": float(prior_mean),
            "prior_std": _fixed("prior_std", prior_std),
            "num_candidates": int(num_candidates),
        }
        if algorithm == 1:
            if delta is None or not 0.0 < float(delta) < 1.0:
                raise ValueError(f"delta must lie strictly between 0 and 1 for algorithm 1, got {delta!r}.")
            settings.update(delta=float(delta), k1=vr.check_k1(k1))
        else:
            if delta not in (None, 0, 0.0):
                raise ValueError(f"algorithm 3 is ε-DP (δ = 0): pass delta=None, got {delta!r}.")
            if release != "score":
                raise UnsupportedBoundError(
                    "Algorithm 3 (Kusner et al. Theorem 7) releases only the best validation score: use release='score'."
                )
            if not isinstance(reg_key, str) or not reg_key:
                raise ValueError("algorithm 3 needs reg_key, the config key of the L2 weight λ of Kusner eq. (10).")
            settings.update(
                delta=0.0,
                lipschitz=vr.check_positive("lipschitz (L)", lipschitz),
                g_star=vr.check_positive("g_star (g*)", g_star),
                validation_size=vr.check_count("validation_size (m)", validation_size),
                reg_key=reg_key,
            )
        self._settings = settings
        self._num_trials, self._seed = int(num_trials), seed
        self._rng = secure_rng(seed)
        self._space: dict | None = None
        self._configs: list[dict] = []
        self._features = np.zeros((0, 0))
        self._trials: dict[str, dict[str, Any]] = {}
        self._observations: list[tuple[int, float]] = []  # (index in Λ, metric as reported)
        self._pending: str | None = None
        self._retry: int | None = None
        self._failures = 0
        self._bounds: dict[str, Any] | None = None
        self._release: dict[str, Any] | None = None
        if space is not None:
            self._set_space(space)

    # ------------------------------------------------------------------ what the accountant reads
    def accounts_trial(self, config: dict[str, Any]) -> bool:
        """False: the training data are public here, so trials report no DP-SGD plan."""
        return False

    def privacy_mechanism(self) -> Mechanism:
        """The release's (ε, δ) (Kusner et al. 2015), charged once per release the search makes."""
        guarantee = self.release_guarantee()
        return Mechanism.release(epsilon=guarantee["epsilon"], delta=guarantee["delta"], description=guarantee)

    def release_guarantee(self) -> dict[str, Any]:
        """(ε, δ) of the release, with its assumption, known before the search starts."""
        s = self._settings
        parts = ["config", "score"] if s["release"] == "both" else [s["release"]]
        k = len(parts)
        if s["algorithm"] == 1:
            assumption = (
                "Kusner et al. 2015 Assumption 1: all validation-set functions are jointly GP(0, k1 ⊗ k2) with "
                f"k1(V, V') >= k1 = {s['k1']} for neighbouring V, V' and k2 = {s['kernel']} (lengthscale "
                f"{s['lengthscale']} on the unit-cube coordinates); each observed (metric - {s['prior_mean']}) / "
                f"{s['prior_std']} is that GP's value plus independent N(0, {s['noise_variance']}) noise"
            )
            theorems = "λ̃: Theorem 1 / Corollary 1; ṽ: Theorem 3 / Corollary 2 with the union bound redone"
        else:
            assumption = (
                "Kusner et al. 2015 Assumption 2: the metric is -(1/m) Σ g(w_λ, x̄_i, ȳ_i) with mode='max', or "
                f"(1/m) Σ g with mode='min', over the m = {s['validation_size']} validation records; 0 <= g <= g* = "
                f"{s['g_star']}, "
                f"g L = {s['lipschitz']}-Lipschitz in w; w_λ is the exact minimiser of (λ/2)||w||² + (1/n) Σ ℓ with ℓ "
                f"convex and 1-Lipschitz in w, λ = config[{s['reg_key']!r}]; no other hyperparameter varies"
            )
            theorems = "Theorem 7 and the finite-Λ bound after it (min{g*/m, L/(mλ_min)} taken as g*/m); Corollary 4"
        return {
            "epsilon": k * s["epsilon"],
            "delta": k * s["delta"],
            "epsilon_per_release": s["epsilon"],
            "delta_per_release": s["delta"],
            "released": parts,
            "composition": "basic composition of the released parts (Kusner et al., after Theorem 4)",
            "algorithm": s["algorithm"],
            "assumption": assumption,
            "theorems": theorems,
            "protects": "validation set",
        }

    def privacy_details(self) -> dict[str, Any]:
        """|Λ|, T, the constants of the release (GP and metric units) and, at the end, the release."""
        details: dict[str, Any] = {
            "algorithm": self._settings["algorithm"],
            "num_trials": self._num_trials,
            "num_candidates": len(self._configs) or None,
            "trials_completed": len(self._observations),
            "settings": dict(self._settings),
            "release": self._release,
        }
        if self._space is not None:
            details.update(self._constants())
        return details

    # ------------------------------------------------------------------ Searcher API
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        self.offer_space(config)
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        if self._space is not None:
            return False
        self._set_space(config)
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._release is not None or len(self._observations) >= self._num_trials:
            return Searcher.FINISHED
        if self._space is None:
            raise RuntimeError(_NO_SPACE)
        if self._metric is None or self._mode not in ("max", "min"):
            raise ValueError(_NO_METRIC)
        if self._pending is not None:
            return None  # one trial at a time: GP-UCB's λ_t needs every earlier observation
        if self._retry is not None:
            if self._failures >= MAX_FAILURES:
                raise PrivacyError(
                    f"The trial for step {len(self._observations) + 1} failed {self._failures} times; DP-BO's "
                    "guarantee needs an observation for each of the T steps, so the search stops without a release."
                )
            index = self._retry
        else:
            index = self.next_index()
        self._trials[trial_id] = {"index": index, "status": "pending"}
        self._pending = trial_id
        config = copy.deepcopy(self._configs[index])
        self.record_suggestion(trial_id, config)
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Records the observation; after the T-th, makes the private release. A repeat call is ignored."""
        record = self._trials.get(trial_id)
        if record is None or record["status"] != "pending":
            return
        self._pending = None
        score = None if error or not result else result.get(self._metric)
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(score):
            record["status"] = "failed"
            self._retry, self._failures = record["index"], self._failures + 1
            logger.warning(
                "Trial %s gave no finite %r; step %d is retried.", trial_id, self._metric, len(self._observations) + 1
            )
            return
        record["status"] = "completed"
        self._retry, self._failures = None, 0
        self._observations.append((record["index"], float(score)))
        if len(self._observations) == self._num_trials:
            self.record_event({"type": "release"})  # charged before it exists: a restore cannot release twice unseen
            self._release = self._make_release()

    def get_state(self) -> dict[str, Any]:
        return {
            "version": 1,
            "num_trials": self._num_trials,
            "seed": self._seed,
            "settings": self._settings,
            "rng_state": self._rng.bit_generator.state,
            "space": self._space,
            "configs": self._configs,
            "features": self._features,
            "metric": self._metric,
            "mode": self._mode,
            "trials": self._trials,
            "observations": self._observations,
            "pending": self._pending,
            "retry": self._retry,
            "failures": self._failures,
            "release": self._release,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("version") != 1:
            raise ValueError(f"Unknown DPBOSearcher state version {state.get('version')!r}.")
        self._num_trials, self._seed, self._settings = int(state["num_trials"]), state["seed"], dict(state["settings"])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng_state"]
        self.check_restored_space(state["space"])
        self._space, self._configs = state["space"], list(state["configs"])
        self._features = np.asarray(state["features"], dtype=float)
        self._metric, self._mode = state["metric"], state["mode"]
        self._trials = {k: dict(v) for k, v in state["trials"].items()}
        self._observations = [tuple(o) for o in state["observations"]]
        self._pending, self._retry, self._failures = state["pending"], state["retry"], int(state["failures"])
        self._release, self._bounds = state["release"], None

    # ------------------------------------------------------------------ GP-UCB and the release
    @property
    def candidates(self) -> list[dict[str, Any]]:
        """Λ, the configurations GP-UCB chooses from (empty before the space is known)."""
        return [copy.deepcopy(c) for c in self._configs]

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """(μ_t, σ_t) over Λ in GP units after the t observations so far."""
        s = self._settings
        x = self._features[[i for i, _ in self._observations]]
        return gp_posterior(
            x,
            self._gp_values(),
            self._features,
            kernel=s["kernel"],
            lengthscale=s["lengthscale"],
            noise_variance=s["noise_variance"],
        )

    def next_index(self) -> int:
        """Index in Λ of GP-UCB's λ_t = argmax μ_{t−1} + √β_t σ_{t−1} (first index on ties)."""
        mean, std = self.posterior()
        t = len(self._observations) + 1
        return int(np.argmax(mean + math.sqrt(vr.beta_t(t, len(self._configs), delta=self._delta_beta())) * std))

    def release_probabilities(self) -> np.ndarray:
        """The exponential mechanism's law of λ̃ over Λ: softmax(ε μ_t / (2Δ)) (algorithm 1)."""
        if self._settings["algorithm"] != 1:
            raise UnsupportedBoundError("Only algorithm 1 releases a configuration (Kusner et al. Theorem 1).")
        mean, _ = self.posterior()
        sensitivity = self._constants()["em_sensitivity"]
        return vr.exponential_mechanism_probabilities(mean, epsilon=self._settings["epsilon"], sensitivity=sensitivity)

    def _delta_beta(self) -> float:
        s = self._settings
        if s["algorithm"] == 3:
            return EXPLORATION_DELTA
        return s["delta"] if s["release"] == "config" else s["delta"] / 2.0

    def _sign(self) -> float:
        return -1.0 if self._mode == "min" else 1.0

    def _gp_values(self) -> np.ndarray:
        """Observations in GP units: sign·(metric − prior_mean)/prior_std."""
        s = self._settings
        raw = np.array([v for _, v in self._observations], dtype=float)
        return self._sign() * (raw - s["prior_mean"]) / s["prior_std"]

    def _constants(self) -> dict[str, Any]:
        if self._bounds is None:
            s, n, t = self._settings, len(self._configs), self._num_trials
            if s["algorithm"] == 1:
                gamma = vr.max_information_gain_bound_from_points(
                    self._features, t, s["noise_variance"], kernel=s["kernel"], lengthscale=s["lengthscale"]
                )
                bounds = vr.algorithm1_bounds(
                    n_candidates=n,
                    num_trials=t,
                    epsilon=s["epsilon"],
                    delta=s["delta"],
                    k1=s["k1"],
                    noise_variance=s["noise_variance"],
                    gamma_bound=gamma,
                    release=s["release"],
                ).to_dict()
                bounds["laplace_scale_metric_units"] = vr.round_up(bounds["laplace_scale"] * s["prior_std"])
                bounds["em_sensitivity_metric_units"] = vr.round_up(bounds["em_sensitivity"] * s["prior_std"])
            else:
                lam = [float(c[s["reg_key"]]) for c in self._configs]
                bounds = {
                    "lambda_min": min(lam),
                    "lambda_max": max(lam),
                    "sensitivity": vr.algorithm3_sensitivity(
                        lipschitz=s["lipschitz"],
                        g_star=s["g_star"],
                        validation_size=s["validation_size"],
                        lambda_min=min(lam),
                        lambda_max=max(lam),
                    ),
                }
                bounds["laplace_scale"] = bounds["laplace_scale_metric_units"] = vr.round_up(
                    bounds["sensitivity"] / s["epsilon"]
                )
            self._bounds = bounds
        return dict(self._bounds)

    def _make_release(self) -> dict[str, Any]:
        """λ̃ and/or ṽ, drawn once from the searcher's generator after the T-th observation."""
        s, bounds, sign = self._settings, self._constants(), self._sign()
        release: dict[str, Any] = {"config": None, "score": None, "index": None}
        if s["release"] in ("both", "config"):
            index = draw_index(self.release_probabilities(), self._rng)
            release["config"], release["index"] = copy.deepcopy(self._configs[index]), index
        if s["release"] in ("both", "score"):
            if s["algorithm"] == 1:
                best = float(self._gp_values().max())  # v* in GP units
                noisy = best + self._rng.laplace(0.0, bounds["laplace_scale"])
                release["score"] = s["prior_mean"] + sign * s["prior_std"] * noisy
            else:
                best = float(max(sign * v for _, v in self._observations))
                release["score"] = sign * (best + self._rng.laplace(0.0, bounds["laplace_scale"]))
        return release

    def _set_space(self, space: dict[str, Any]) -> None:
        configs, features = build_candidate_set(space, self._rng, self._settings["num_candidates"])
        if self._settings["algorithm"] == 3:
            _check_regularisation_only(configs, self._settings["reg_key"])
        self._space, self._configs, self._features, self._bounds = space, configs, features, None


def _check_regularisation_only(configs: list[dict], key: str) -> None:
    """Algorithm 3 (Theorem 7) covers only the L2 weight λ > 0: every other value must be constant."""
    if any(key not in c for c in configs):
        raise ValueError(f"reg_key {key!r} is not a key of the search space.")
    values = [c[key] for c in configs]
    if any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v > 0) for v in values):
        raise ValueError(f"Every value of {key!r} must be a finite L2 weight λ > 0 (Kusner eq. 10).")
    rest = {json.dumps({k: v for k, v in c.items() if k != key}, sort_keys=True, default=repr) for c in configs}
    if len(rest) > 1:
        raise UnsupportedBoundError(
            f"Algorithm 3's bound (Kusner et al. Theorem 7) covers only the L2 weight {key!r}; another "
            "hyperparameter varies over the space, which no proven bound covers. Fix the others."
        )
