"""Sorts surviving mutants of the accounting layer by what they do to the reported numbers.

Run by scripts/mutants.sh from mutmut's ``mutants/`` folder, with the names of the surviving
mutants on stdin. Every mutant runs, in a process forked for it alone (no cache carried over),
the probes that reach its function: a panel of what the product reports (ε, δ, RDP orders,
noise scales, counts charged) over every bound, law, profile and mechanism kind, plus inputs
that must be refused and the share of partner bounds (partner_search) still certified in mpmath.
Each probe value is oriented so that larger is more conservative, and each mutant is sorted into
one verdict:

- ``LOWERS``: some reported number is smaller than the unmutated code's (an optimistic ε):
  a test must kill it;
- ``ACCEPTS``: an input that must be refused is accepted: a test must kill it;
- ``changes``: a law's own number changed (mean, pmf, sampling): read it;
- ``raises``, ``safe``: only errors, timeouts or larger (more conservative) numbers;
- ``same``: every probe that reaches the function gives the same numbers (equivalent on this
  panel, not a proof);
- ``unreached``: no probe reaches the function: read it.

Prints one line per mutant (verdict, largest relative decrease, the probe) and a count per verdict.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing import get_context

import mpmath
import numpy as np
from dp_accounting.pld import privacy_loss_distribution
from mutmut.mutation import trampoline

from ray_dptune.accounting.bookkeeping import account as account_module
from ray_dptune.accounting.bookkeeping import calibrate
from ray_dptune.accounting.bookkeeping.guarantee import compose_with_releases
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, covering_curve, sampling_schedule, unit_spend
from ray_dptune.accounting.bounds import dpbo_bounds, information_gain, svt
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    RunCountDistribution,
    TruncatedNegativeBinomial,
    secure_rng,
)
from ray_dptune.accounting.bounds.dphypo_bound import dphypo_lemma_bound
from ray_dptune.accounting.bounds.lemma7.generic import generic_repeat_and_select
from ray_dptune.accounting.bounds.lemma7.partner_search import constraint_orders, lowest_partner
from ray_dptune.accounting.bounds.rounding import round_up
from ray_dptune.accounting.bounds.selection import repeat_and_select
from ray_dptune.accounting.curves import pld_reading, profiles
from ray_dptune.accounting.curves.rdp import RDPCurve

Probe = Callable[[], dict[str, float]]
TIMEOUT_S = 120
DELTAS = (1e-5, 1e-9)


def plan() -> TrialSpend:
    """The DP-SGD plan the probes use (built in each probe, so that a mutant of its checks is reached)."""
    return TrialSpend(sample_rate=64 / 1437, noise_multiplier=1.1, steps=60)


def all_laws() -> dict[str, RunCountDistribution]:
    """One law of each family (built in each probe: ``from_mean`` is then under the mutant)."""
    return {
        "poisson": Poisson(mean=10),
        "geometric": Geometric.from_mean(10),
        "logarithmic": Logarithmic.from_mean(10),
        "tnb_half": TruncatedNegativeBinomial.from_mean(0.5, 8),
        "tnb_neg": TruncatedNegativeBinomial.from_mean(-0.5, 6),
        "point": PointMass(5),
    }


def epsilons(prefix: str, curve: RDPCurve) -> dict[str, float]:
    """ε at each δ, δ at ε = 2, and the RDP at a few orders (the curve's own values)."""
    out = {f"{prefix} eps@{d:g}": curve.epsilon(delta=d) for d in DELTAS}
    out[f"{prefix} delta@2"] = curve.delta(epsilon=2.0)
    for order in (1.5, 2.0, 8.0, 32.0):
        out[f"{prefix} rdp@{order}"] = float(curve.at(np.array([order]))[0])
    return out


def curves() -> dict[str, float]:
    out: dict[str, float] = {}
    for sigma in (0.8, 3.0):
        base = RDPCurve.gaussian(noise_multiplier=sigma)
        out |= epsilons(f"gaussian {sigma}", base)
        out |= epsilons(f"3x gaussian {sigma}", 3 * base)
    out |= epsilons("zcdp", RDPCurve.zcdp(rho=0.1))
    out |= epsilons("pure", RDPCurve.pure(epsilon=1.0))
    sub = RDPCurve.subsampled_gaussian(sample_rate=0.05, noise_multiplier=1.1, steps=100)
    out |= epsilons("subsampled", sub)
    out |= epsilons("sum", sub + RDPCurve.pure(epsilon=0.3))
    out |= epsilons("minimum", sub.minimum(RDPCurve.zcdp(rho=0.2)))
    out |= epsilons("smoothed", sub.smoothed())
    out |= epsilons("resampled", sub.resample(np.array([1.25, 2.0, 5.0, 20.0, 64.0])))
    out |= epsilons("round trip", RDPCurve.from_dict(sub.to_dict()))
    out["round_up"] = round_up(1.0 / 3.0)
    return out


def selection(base_name: str, base: Callable[[], RDPCurve], generic: bool) -> Probe:
    def probe() -> dict[str, float]:
        out: dict[str, float] = {}
        for name, law in all_laws().items():
            out |= epsilons(f"{base_name} {name} generic={generic}", repeat_and_select(base(), law, generic=generic))
        return out

    return probe


def adaptive() -> dict[str, float]:
    base = RDPCurve.gaussian(noise_multiplier=3.0)
    out: dict[str, float] = {}
    for name in ("geometric", "tnb_half", "logarithmic"):
        law = all_laws()[name]
        out |= epsilons(f"dphypo {name}", repeat_and_select(base, law, density_ratio=2 / 0.75))
        out |= epsilons(f"dphypo upper {name}", repeat_and_select(base, law, density_ratio=2 / 0.75, upper=2.0))
    out |= epsilons("lemma", dphypo_lemma_bound(base, all_laws()["geometric"], density_ratio=2 / 0.75))
    out |= epsilons("generic", generic_repeat_and_select(plan().curve(), all_laws()["logarithmic"]))
    return out


def base_profiles() -> dict[str, float]:
    grid = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    out: dict[str, float] = {}
    for i, d in enumerate(profiles.gaussian_profile(noise_multiplier=1.3)(grid)):
        out[f"gaussian delta@{grid[i]}"] = float(d)
    profile = profiles.subsampled_gaussian_profile(sample_rate=0.05, noise_multiplier=1.1, steps=40)
    for i, d in enumerate(profile(grid)):
        out[f"dpsgd delta@{grid[i]}"] = float(d)
    known = profiles.KnownMechanism(noise_multiplier=1.1, sample_rate=0.05, steps=40)
    out["known eps"] = known.epsilon(delta=1e-5)
    out["known gaussian eps"] = profiles.KnownMechanism(noise_multiplier=2.0, steps=4).epsilon(delta=1e-5)
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        1.1, sampling_prob=0.05, value_discretization_interval=1e-3
    ).self_compose(10)
    for i, d in enumerate(pld_reading.hockey_stick_deltas(pld, grid)):
        out[f"pld delta@{grid[i]}"] = float(d)
    orders = np.array([1.5, 2.0, 4.0, 16.0, 64.0])
    for adaptive in (False, True):
        rdp = profiles.subsampled_gaussian_rdp(
            sample_rate=0.05, noise_multiplier=0.9, steps=5, orders=orders, adaptive=adaptive
        )
        out |= {f"sgm adaptive={adaptive} rdp@{order}": float(v) for order, v in zip(orders, rdp)}
    return out


def events(mechanism: SearchMechanism, *, accounted: bool = True) -> account_module.SearchAccount:
    account = account_module.SearchAccount(mechanism, delta=1e-5, plan=plan().to_dict())
    for trial in ("a", "b", "c"):
        account.apply({"type": "started", "trial_id": trial, "accounted": accounted})
        account.apply({"type": "reported", "trial_id": trial, "spent": plan().to_dict()})
    account.apply({"type": "completed", "trial_id": "a"})
    account.apply({"type": "failed", "trial_id": "b", "retry": True})
    account.apply({"type": "started", "trial_id": "b", "accounted": accounted})
    account.apply({"type": "restored"})
    return account


def accounts() -> dict[str, float]:
    out: dict[str, float] = {}
    kinds = {
        "random": SearchMechanism.random_count(law=all_laws()["poisson"], num_trials=2),
        "composition": SearchMechanism.composition(),
        "overhead": SearchMechanism.constant_overhead(epsilon_round=0.05, max_rounds=30),
        "release": SearchMechanism.release(epsilon=0.5, delta=1e-6),
    }
    for name, mechanism in kinds.items():
        account = events(mechanism)
        if name == "overhead":
            account.apply({"type": "selection"})
        if name == "release":
            account.apply({"type": "release", "release": {"epsilon": 0.5, "delta": 1e-6}})
        for stopped in (False, True):
            out[f"{name} eps stopped={stopped}"] = account.guarantee(if_stopped_now=stopped).epsilon
            out[f"{name} charged stopped={stopped}"] = account.charged_attempts(if_stopped_now=stopped)
        out[f"{name} eps +2"] = account.guarantee(extra_charges=2).epsilon
        out[f"{name} after start"] = account.guarantee_after(
            {"type": "started", "trial_id": "d", "accounted": True}
        ).epsilon
        out[f"{name} started"] = account.num_trials_started
    halving = account_module.SearchAccount(
        SearchMechanism.halving(budget_units=12, max_t=4), delta=1e-5, plan=plan().to_dict()
    )
    for trial in ("a", "b"):
        halving.apply({"type": "suggested", "trial_id": trial, "accounted": True, "units": 2, "bracket": 0})
        halving.apply({"type": "started", "trial_id": trial, "accounted": True})
    halving.apply({"type": "charged", "trial_id": "a", "units": 2})
    over = TrialSpend(sample_rate=plan().sample_rate, noise_multiplier=plan().noise_multiplier, steps=90)
    halving.apply({"type": "reported", "trial_id": "b", "spent": over.to_dict()})
    out["halving eps"] = halving.guarantee().epsilon
    out["halving units"] = halving.units_charged
    brackets = account_module.SearchAccount(
        SearchMechanism.halving(budget_units=12, max_t=4, law=all_laws()["poisson"], num_brackets=3),
        delta=1e-5,
        plan=plan().to_dict(),
    )
    out["halving brackets eps"] = brackets.guarantee().epsilon
    out["release compose"] = compose_with_releases(
        RDPCurve.gaussian(noise_multiplier=2.0), release_epsilon=0.5, release_delta=1e-6, delta=1e-5
    )
    return out


def calibration() -> dict[str, float]:
    def plan_for(sigma: float) -> TrialSpend:
        return TrialSpend(sample_rate=plan().sample_rate, noise_multiplier=sigma, steps=plan().steps)

    out = {
        "search eps": calibrate.search_epsilon(plan(), delta=1e-5, law=all_laws()["geometric"]),
        "search eps retries": calibrate.search_epsilon(plan(), delta=1e-5, law=all_laws()["poisson"], retries=2),
        "sigma": calibrate.calibrate_noise_multiplier(plan_for, epsilon=3.0, delta=1e-5, law=all_laws()["poisson"]),
    }
    return out


def spends() -> dict[str, float]:
    scored = TrialSpend(sample_rate=0.05, noise_multiplier=1.1, steps=30, score_noise_multiplier=4.0, score_releases=3)
    out = epsilons("scored", scored.curve())
    out |= epsilons("repeated", scored.repeated(3).curve())
    out |= epsilons("covering", covering_curve([plan().to_dict(), scored.to_dict()]))
    out |= epsilons("unit", unit_spend(plan().to_dict(), units_per_plan=6).curve())
    rate, steps = sampling_schedule(1437, 64)
    out["schedule rate"], out["schedule steps"] = rate, steps
    out["covers"] = float(scored.covers(plan()))
    return out


def sparse_vector() -> dict[str, float]:
    params = svt.SVTParams(partitions=5, epsilon=0.2, granularity=0.05, initial_utility=0.1)
    out = epsilons("svt", svt.svt_curve(epsilon=0.2, rounds=25))
    out["default rounds"] = svt.default_max_rounds(params)
    out["worst noiseless"] = svt.worst_case_noiseless_rounds(params)
    out["noiseless"] = svt.noiseless_rounds(7)
    out["query scale"], out["threshold scale"] = params.query_scale, params.threshold_scale
    out["sensitivity"] = params.sensitivity
    return out


def dpbo() -> dict[str, float]:
    rng = np.random.default_rng(0)
    points = rng.uniform(size=(30, 2))
    kernel = information_gain.kernel_matrix(points, points, kernel="rbf", lengthscale=0.3)
    gamma = information_gain.max_information_gain_bound(kernel, 10, 0.1)
    out = {"gamma": gamma, "info gain": information_gain.information_gain(kernel[:5, :5], 0.1)}
    out["gamma points"] = information_gain.max_information_gain_bound_from_points(
        points, 10, 0.1, kernel="rbf", lengthscale=0.3
    )
    bounds = dpbo_bounds.algorithm1_bounds(
        n_candidates=30, num_trials=10, epsilon=1.0, delta=1e-5, k1=0.9, noise_variance=0.1, gamma_bound=gamma
    )
    out |= {f"alg1 {k}": float(v) for k, v in bounds.to_dict().items() if k not in ("epsilon", "delta")}
    out["alg3 scale"] = dpbo_bounds.algorithm3_laplace_scale(
        epsilon=1.0, lipschitz=1.0, g_star=1.0, validation_size=100, lambda_min=0.1, lambda_max=1.0
    )
    out["shift"] = dpbo_bounds.dataset_shift_bound(0.9, 30, failure=1e-5)
    return out


def laws() -> dict[str, float]:
    """Not oriented: a law's own numbers (any change is read by hand)."""
    out: dict[str, float] = {}
    for name, law in all_laws().items():
        out[f"{name} mean"] = law.mean
        out[f"{name} prob0"] = law.prob_zero
        for k in (0, 1, 2, 5, 20):
            out[f"{name} pmf{k}"] = float(law.pmf(k))
        for x in (0.3, 0.9):
            out[f"{name} pgf{x}"] = float(law.pgf(x))
            out[f"{name} dlogpgf{x}"] = float(law.log_pgf_derivative(x))
        rng = secure_rng(7)
        draws = [law.sample(rng) for _ in range(400)]
        out[f"{name} sample mean"] = float(np.mean(draws))
        out[f"{name} expected quantile"] = law.expected_quantile()
        out[f"{name} success"] = law.success_probability(0.05)
    twins, other = Poisson(mean=10), Poisson(mean=11)
    out["equal"] = float(twins == Poisson(mean=10) and hash(twins) == hash(Poisson(mean=10)))
    out["unequal"] = float(twins != other and twins != all_laws()["geometric"])
    return out


MUST_REFUSE: dict[str, Callable[[], object]] = {
    "density ratio < 1": lambda: repeat_and_select(
        RDPCurve.gaussian(noise_multiplier=2.0), all_laws()["poisson"], density_ratio=0.5
    ),
    "adaptive poisson": lambda: repeat_and_select(
        RDPCurve.gaussian(noise_multiplier=2.0), all_laws()["poisson"], density_ratio=2.0
    ),
    "negative mean": lambda: Poisson(mean=-1.0),
    "eta -1": lambda: TruncatedNegativeBinomial(-1.0, 0.5),
    "delta 0": lambda: RDPCurve.gaussian(noise_multiplier=2.0).epsilon(delta=0.0),
    "delta 1": lambda: RDPCurve.gaussian(noise_multiplier=2.0).epsilon(delta=1.0),
    "release over delta": lambda: account_module.SearchAccount(
        SearchMechanism.release(epsilon=1.0, delta=1e-4), delta=1e-5
    ),
    "releases need all delta": lambda: compose_with_releases(None, release_epsilon=1.0, release_delta=1e-5, delta=1e-5),
    "negative release epsilon": lambda: SearchMechanism.release(epsilon=-0.5, delta=1e-6),
    "halving selection curve": lambda: SearchMechanism.halving(budget_units=12, max_t=4).selection_curve(
        RDPCurve.gaussian(noise_multiplier=2.0)
    ),
    "partner with nan": lambda: generic_repeat_and_select(
        RDPCurve.gaussian(noise_multiplier=2.0), Poisson(mean=5), partner=lambda q: np.where(q > 0.5, np.nan, 0.0)
    ),
    "negative extra charges": lambda: events(SearchMechanism.composition()).guarantee(extra_charges=-1),
}


def partner_certificates() -> dict[str, float]:
    """The share of partner bounds p ≤ b(q) that are certified in 40-digit mpmath (1.0 when all are): at p, some
    constraint D_α(Bern(q)‖Bern(p)) or D_α(Bern(p)‖Bern(q)) ≤ ε(α) of the curve (all its orders, smoothed) must
    fail. The reported numbers cannot show a partner that is a little too high; this can."""
    q = np.r_[0.0, np.geomspace(1e-18, 0.5, 120), 1.0 - np.geomspace(0.5, 1e-12, 60)[1:], 1.0]
    out: dict[str, float] = {}
    for name, curve in (
        ("gaussian", RDPCurve.gaussian(noise_multiplier=2.0)),
        ("pure", RDPCurve.pure(epsilon=3.0)),
        ("dpsgd", plan().curve()),
    ):
        p = lowest_partner(q, *constraint_orders(RDPCurve(curve.orders, curve.epsilons)))
        finite = np.isfinite(curve.epsilons)
        alphas, eps = curve.orders[finite], np.minimum.accumulate(curve.epsilons[finite][::-1])[::-1]
        positive = np.nonzero(p > 0)[0]
        checked = np.unique(np.r_[positive[:6], positive[np.linspace(0, positive.size - 1, 12).astype(int)]])
        out[f"partner certified {name}"] = float(np.mean([_certified(q[i], p[i], alphas, eps) for i in checked]))
    return out


def _certified(q: float, p: float, alphas: np.ndarray, eps: np.ndarray) -> bool:
    if not 0.0 <= p <= q:
        return False
    with mpmath.workdps(40):
        q_, p_ = mpmath.mpf(q), mpmath.mpf(p)
        for alpha, limit in zip(alphas, eps):
            a = mpmath.mpf(alpha)
            for hi, lo in ((q_, p_), (p_, q_)):
                s = hi**a * lo ** (1 - a) + (1 - hi) ** a * (1 - lo) ** (1 - a)
                if mpmath.log(s) / (a - 1) > mpmath.mpf(limit):
                    return True
    return False


PROBES: dict[str, Probe] = {
    "curves": curves,
    "selection gaussian": selection("gaussian", lambda: RDPCurve.gaussian(noise_multiplier=3.0), True),
    "selection gaussian closed": selection("gaussian", lambda: RDPCurve.gaussian(noise_multiplier=3.0), False),
    "selection dpsgd": selection("dpsgd", plan().curve, True),
    "selection pure": selection("pure", lambda: RDPCurve.pure(epsilon=0.4), True),
    "adaptive": adaptive,
    "partner certificates": partner_certificates,
    "profiles": base_profiles,
    "accounts": accounts,
    "calibration": calibration,
    "spends": spends,
    "sparse vector": sparse_vector,
    "dpbo": dpbo,
    "laws": laws,
    **{f"refuse {name}": (lambda call=call: refused(call)) for name, call in MUST_REFUSE.items()},
}


def refused(call: Callable[[], object]) -> dict[str, float]:
    """1.0 when ``call`` raises (as it must), 0.0 when it is accepted."""
    try:
        call()
    except Exception:  # noqa: BLE001 (any refusal counts: the probe asks only that it is refused)
        return {"refused": 1.0}
    return {"refused": 0.0}


def run_probe(mutant: str, probe: str) -> tuple[str, dict[str, float] | str, set[str]]:
    """In a fresh forked process: the probe's values under ``mutant`` ("stats": none, recording hits)."""
    hits: set[str] = set()
    trampoline.record_trampoline_hit = lambda name, caller=None: hits.add(name)
    trampoline.set_mutant_under_test(mutant)
    signal.alarm(TIMEOUT_S)
    try:
        return probe, PROBES[probe](), hits
    except Exception as error:  # noqa: BLE001 (a mutant that raises is safe: it reports nothing)
        return probe, f"{type(error).__name__}: {str(error)[:80]}", hits
    finally:
        signal.alarm(0)


def timeout(signum: int, frame: object) -> None:
    raise TimeoutError(f"over {TIMEOUT_S} s")


def verdict(base: dict[str, float], values: dict[str, float] | str, probe: str) -> tuple[str, float, str]:
    if isinstance(values, str):
        return "raises", 0.0, values
    if probe.startswith("refuse "):
        return ("ACCEPTS", 1.0, probe) if values["refused"] < base["refused"] else ("same", 0.0, "")
    worst, where, raised = 0.0, "", False
    for key, old in base.items():
        new = values.get(key, math.nan)
        if new == old or (math.isnan(new) and math.isnan(old)):
            continue
        if probe == "laws":
            return "changes", abs(new - old) / max(abs(old), 1e-300), key
        if math.isnan(new) or new < old:
            drop = 1.0 if math.isnan(new) else (old - new) / max(abs(old), 1e-300)
            if drop > worst:
                worst, where = drop, f"{probe}: {key} {old!r} -> {new!r}"
        else:
            raised = True
    if worst > 0:
        return "LOWERS", worst, where
    return ("safe", 0.0, "") if raised else ("same", 0.0, "")


RANK = ["LOWERS", "ACCEPTS", "changes", "unreached", "raises", "safe", "same"]


def main() -> None:
    signal.signal(signal.SIGALRM, timeout)
    mutants = [line.strip() for line in sys.stdin if line.strip()]
    workers = int(os.environ.get("PROBE_WORKERS", "2"))
    with get_context("fork").Pool(workers, maxtasksperchild=1) as pool:  # a fresh fork per probe: no cache kept
        baseline = {p: (v, h) for p, v, h in pool.starmap(run_probe, [("stats", p) for p in PROBES], chunksize=1)}
        broken = {
            p: v for p, (v, _) in baseline.items() if isinstance(v, str) or p.startswith("refuse ") and not v["refused"]
        }
        if broken:
            raise SystemExit(f"the unmutated code fails probes: {broken}")
        reach = {
            mutant: [p for p, (_, hits) in baseline.items() if mutant.rsplit("__mutmut_", 1)[0] in hits]
            for mutant in mutants
        }
        jobs = [(m, p) for m in mutants for p in reach[m]]
        results: dict[str, list[tuple[str, float, str]]] = {m: [] for m in mutants}
        for (mutant, _), (probe, values, _) in zip(jobs, pool.starmap(run_probe, jobs, chunksize=1)):
            results[mutant].append(verdict(baseline[probe][0], values, probe))
    counts: dict[str, int] = {}
    for mutant in mutants:
        found = results[mutant] or [("unreached", 0.0, "")]
        kind, drop, where = min(found, key=lambda v: (RANK.index(v[0]), -v[1]))
        counts[kind] = counts.get(kind, 0) + 1
        print(f"{kind:9s} {drop:9.2e} {mutant}  {where}")
    print("verdicts:", ", ".join(f"{counts.get(k, 0)} {k}" for k in RANK))


if __name__ == "__main__":
    main()
