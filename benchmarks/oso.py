"""OSO-DPSGD against fixed and quantile clipping at equal privacy for the WHOLE search.

Galli et al. ("Online Sensitivity Optimization in Differentially Private Learning",
Table 2 and §Experiments) compare clipping strategies when the privacy budget covers
the hyperparameter search, not one run: a method with fewer hyperparameters needs fewer
trials, so each trial may spend more. This script runs that comparison with this
package's accounting, on scikit-learn's digits (``digits_cnn``, SGD, batch 64, q = 64/1437):

* Each arm is a private random search (Papernot & Steinke 2022): K ~ Poisson(E[K]) trials,
  configurations drawn uniformly (log-uniform) from the arm's space, the best final
  validation accuracy released. σ per trial is calibrated with
  ``calibrate_noise_multiplier`` so that the whole search (``repeat_and_select`` with the
  Poisson law) meets (ε, δ) = (``--epsilon``, ``--delta``); every clipping mode is
  accounted as plain DP-SGD at σ (``ray_dptune.training.clipping``).
* The search is simulated directly, without Ray (exactly what ``RandomCountSearcher``
  does: draw K, draw K configurations, train each with ``ray_dptune.training.train``,
  keep the best); K = 0 releases nothing data-dependent and scores chance (0.1).
* The 360 validation images are split (stratified, seed 0) into 180 for selection and
  180 held out: the selected trial's held-out accuracy is free of the selection's
  optimism, which grows with K.
* Common random numbers: in each repetition, arms with the same E[K] draw the same K, and
  trial j of every arm the same ρ (then C or γ) and training seed, so the controls are paired.

Arms (the paper's ranges: ρ in [10^-2.5, 10^1.5], C in [10^-2, 10^2], γ in [0.1, 0.9],
C_0 = 0.1 for the adaptive methods, ρ_c = ρ_r = 2.5e-3, η_C = 0.2):

=================  ====================================  ======  ==========================================
arm                space                                 E[K]    why
=================  ====================================  ======  ==========================================
``oso``            ρ_0                                   4       OSO: one hyperparameter, few trials
``fixed``          ρ × C                                 12      fixed threshold: two, more trials
``quantile``       ρ × γ                                 12      quantile-adaptive: two, more trials
``fixed-lr-only``  ρ (C = C_0 = 0.1)                     4       control: OSO with its adaptation off
``fixed-same-k``   ρ × C                                 4       control: fixed with OSO's trial count
=================  ====================================  ======  ==========================================

Usage (default: ~700 trials, ~6-10 minutes on 2 idle cores; writes ``benchmarks/results/oso.md``)::

    .venv/bin/python benchmarks/oso.py
    .venv/bin/python benchmarks/oso.py --repeats 20 --epochs 20 --workers 8   # bigger
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CHANCE = 0.1
LR_RANGE = (10**-2.5, 10**1.5)
CLIP_RANGE = (1e-2, 1e2)
QUANTILE_RANGE = (0.1, 0.9)
CLIP_0 = 0.1


@dataclass(frozen=True)
class Arm:
    """One private search: a clipping method, its space and the mean of K."""

    name: str
    clipping: str
    tunes: str  # the tuned hyperparameters, for the table
    mean: float

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """One configuration, uniform (log-uniform for ρ and C) on the arm's space."""
        config: dict[str, Any] = {"clipping": self.clipping, "lr": _log_uniform(rng, LR_RANGE), "max_grad_norm": CLIP_0}
        if "C" in self.tunes:
            config["max_grad_norm"] = _log_uniform(rng, CLIP_RANGE)
        if "γ" in self.tunes:
            config["target_quantile"] = float(rng.uniform(*QUANTILE_RANGE))
        return config


def default_arms(oso_mean: float, two_d_mean: float) -> list[Arm]:
    return [
        Arm("oso", "oso", "ρ_0", oso_mean),
        Arm("fixed", "fixed", "ρ × C", two_d_mean),
        Arm("quantile", "quantile", "ρ × γ", two_d_mean),
        Arm("fixed-lr-only", "fixed", "ρ", oso_mean),
        Arm("fixed-same-k", "fixed", "ρ × C", oso_mean),
    ]


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return float(np.exp(rng.uniform(np.log(bounds[0]), np.log(bounds[1]))))


# ---------------------------------------------------------------------------- one trial (worker process)
_DATA: dict[str, Any] = {}


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def _data():
    """(train, selection half of validation, held-out half), built once per worker."""
    if not _DATA:
        import torch
        from sklearn.model_selection import train_test_split
        from torch.utils.data import TensorDataset

        from ray_dptune.training import digits_data

        train_set, val_set = digits_data()
        inputs, targets = val_set.tensors
        select, held = train_test_split(np.arange(len(targets)), test_size=0.5, random_state=0, stratify=targets)
        _DATA["sets"] = (
            train_set,
            TensorDataset(inputs[torch.as_tensor(select)], targets[torch.as_tensor(select)]),
            TensorDataset(inputs[torch.as_tensor(held)], targets[torch.as_tensor(held)]),
        )
    return _DATA["sets"]


def run_trial(task: dict[str, Any]) -> dict[str, Any]:
    """Trains one configuration; returns its final selection accuracy, held-out accuracy and clipping state."""
    import torch

    from ray_dptune.training import TrainState, digits_cnn, dp_trainable, train

    train_set, select_set, held_set = _data()
    trainable = dp_trainable(
        digits_cnn,
        lambda config: (train_set, select_set),
        noise_multiplier=task["sigma"],
        batch_size=64,
        epochs=task["epochs"],
        seed=task["seed"],
    )
    last: dict[str, Any] = {}

    def report(metrics: dict[str, Any], checkpoint_dir: str) -> None:
        last["score"] = metrics["val_acc"]
        last["state"] = TrainState.load(checkpoint_dir)

    start = time.perf_counter()
    train(task["config"], trainable.spec, report)
    seconds = time.perf_counter() - start
    model = digits_cnn()
    model.load_state_dict(last["state"].model_state)
    with torch.no_grad():
        inputs, targets = held_set.tensors
        held_out = float((model(inputs).argmax(dim=1) == targets).float().mean())
    return {**task, "score": last["score"], "held_out": held_out, "seconds": seconds, "clip": _clip_summary(last)}


def _clip_summary(last: dict[str, Any]) -> dict[str, float]:
    state = last["state"].clipping_state or {}
    if "log_clip" in state:
        return {"final_clip": float(np.exp(state["log_clip"])), "final_lr": float(np.exp(state["log_lr"]))}
    if "max_grad_norm" in state:
        return {"final_clip": float(state["max_grad_norm"])}
    return {}


# ---------------------------------------------------------------------------- the searches
def calibrate(arms: list[Arm], args: argparse.Namespace) -> dict[float, dict[str, float]]:
    """σ per E[K], with the whole-search and one-trial ε it gives."""
    from ray_dptune import Poisson, calibrate_noise_multiplier
    from ray_dptune.accounting.bookkeeping.calibrate import search_epsilon
    from ray_dptune.accounting.bookkeeping.spend import TrialSpend
    from ray_dptune.training import PrivacyParams, trial_plan

    n_train = 1437
    out = {}
    for mean in sorted({arm.mean for arm in arms}):

        def plan_for(sigma: float) -> TrialSpend:
            return trial_plan(PrivacyParams(noise_multiplier=sigma, batch_size=64, epochs=args.epochs), n_train)

        sigma = calibrate_noise_multiplier(plan_for, epsilon=args.epsilon, delta=args.delta, law=Poisson(mean))
        plan = plan_for(sigma)
        out[mean] = {
            "sigma": sigma,
            "search_epsilon": search_epsilon(plan, law=Poisson(mean), delta=args.delta),
            "trial_epsilon": plan.curve().epsilon(delta=args.delta),
            "steps": plan.steps,
            "sample_rate": plan.sample_rate,
        }
    return out


def tasks_for(arms: list[Arm], sigmas: dict[float, dict[str, float]], args: argparse.Namespace) -> list[dict]:
    """Every trial of every repetition of every arm: K and the configurations are drawn here, once.

    Common random numbers: in a repetition, arms with the same E[K] draw the same K, and
    trial j of every arm draws its ρ (then C or γ) and its training seed (initialisation,
    batches, DP noise) from the same stream, so `oso` and `fixed-lr-only` differ only in
    OSO's adaptation, and `fixed` and `fixed-same-k` share their first trials.
    """
    tasks = []
    for arm in arms:
        for repeat in range(args.repeats):
            k = int(np.random.default_rng([args.seed, repeat, round(arm.mean * 1000)]).poisson(arm.mean))
            tasks.append({"arm": arm.name, "repeat": repeat, "k": k, "config": None})  # the draw of K itself
            for trial in range(k):
                stream = np.random.SeedSequence([args.seed, repeat, trial])
                tasks.append(
                    {
                        "arm": arm.name,
                        "repeat": repeat,
                        "k": k,
                        "config": arm.sample(np.random.default_rng(stream)),
                        "sigma": sigmas[arm.mean]["sigma"],
                        "epochs": args.epochs,
                        "seed": int(stream.generate_state(1)[0]),
                    }
                )
    return tasks


def summarise(arms: list[Arm], results: list[dict], draws: list[dict]) -> dict[str, dict[str, Any]]:
    summary = {}
    for arm in arms:
        best_scores, held_outs, seconds, selected, ks = [], [], [], [], []
        for draw in (d for d in draws if d["arm"] == arm.name):
            trials = [r for r in results if r["arm"] == arm.name and r["repeat"] == draw["repeat"]]
            ks.append(draw["k"])
            seconds.append(sum(t["seconds"] for t in trials))
            if not trials:  # K = 0: the release is data-independent
                best_scores.append(CHANCE)
                held_outs.append(CHANCE)
                continue
            best = max(trials, key=lambda t: t["score"])
            best_scores.append(best["score"])
            held_outs.append(best["held_out"])
            selected.append(best)
        arm_trials = [r for r in results if r["arm"] == arm.name]
        summary[arm.name] = {
            "k": np.array(ks),
            "best": np.array(best_scores),
            "held_out": np.array(held_outs),
            "seconds": np.array(seconds),
            "selected": selected,
            "trials": arm_trials,
        }
    return summary


# ---------------------------------------------------------------------------- report
def _mean_sd(values: np.ndarray) -> str:
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if len(values) > 1 else f"{values.mean():.3f}"


def _gap(a: np.ndarray, b: np.ndarray, *, paired: bool) -> tuple[float, float]:
    """Mean difference a − b over the repetitions and 1.96 × its standard error (paired: same K and draws)."""
    if paired:
        return float((a - b).mean()), float(1.96 * (a - b).std(ddof=1) / np.sqrt(len(a)))
    return float(a.mean() - b.mean()), float(1.96 * np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b)))


def _verdict(delta: float, half_width: float) -> str:
    if delta - half_width > 0:
        return "OSO better"
    if delta + half_width < 0:
        return "OSO worse"
    return "no significant difference"


def _verdict_text(arms: list[Arm], summary: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The answer to "does OSO win?", from the held-out accuracies of the released models."""
    by_name = {arm.name: arm for arm in arms}
    held = {name: summary[name]["held_out"] for name in by_name}
    lines = []
    for rival in ("fixed", "quantile"):
        delta, half = _gap(held["oso"], held[rival], paired=False)
        lines.append(
            f"* Against `{rival}` (E[K] = {by_name[rival].mean:g}, tuning {by_name[rival].tunes}) at the same "
            f"whole-search ε = {args.epsilon:g}: OSO (E[K] = {by_name['oso'].mean:g}) released models with held-out "
            f"accuracy {held['oso'].mean():.3f} vs {held[rival].mean():.3f}, a difference of {delta:+.3f} ± {half:.3f}: "
            + (
                "OSO wins."
                if delta - half > 0
                else "OSO loses."
                if delta + half < 0
                else f"not significant over {args.repeats} repetitions."
            )
        )
    delta, half = _gap(held["oso"], held["fixed-lr-only"], paired=True)
    effect = (
        "OSO's adaptation of C_t and ρ_t helped"
        if delta - half > 0
        else "OSO's adaptation of C_t and ρ_t hurt"
        if delta + half < 0
        else "OSO's adaptation of C_t and ρ_t made no measurable difference"
    )
    lines.append(
        f"* Against its own control `fixed-lr-only` (same K, same ρ_0 draws, same seeds, C fixed at C_0 = {CLIP_0}): "
        f"{delta:+.3f} ± {half:.3f} (paired): {effect}."
        + (
            " Whatever OSO gains or loses against the rivals comes from its search space (one hyperparameter, "
            "C held at a small C_0, so fewer trials and less noise per trial), not from the online updates."
            if abs(delta) <= half
            else ""
        )
    )
    return lines


def render(arms, sigmas, summary, args, runtime, provenance) -> str:
    lines = [
        "# OSO-DPSGD vs fixed and quantile clipping at equal privacy for the whole search",
        "",
        f"Command: `{provenance['command']}`  ",
        (
            f"Date: {provenance['date']}, commit {provenance['commit']}{provenance['dirty']}, "
            f"{platform.machine()} with {os.cpu_count()} CPUs, Python {platform.python_version()}, torch "
            f"{provenance['torch']}, opacus {provenance['opacus']}; {args.workers} worker processes (1 torch thread "
            f"each); runtime {runtime:.0f} s; load average {provenance['load']} at the start (the machine is shared: "
            "timings are indicative)."
        ),
        "",
        "## Settings",
        "",
        (
            f"* Data and model: scikit-learn's digits, 1 437 training images; the 360 validation images split "
            f"(stratified, seed 0) into 180 for selection and 180 held out. `digits_cnn`, SGD, batch 64 "
            f"(q = {sigmas[arms[0].mean]['sample_rate']:.4f}), {args.epochs} epochs = "
            f'{sigmas[arms[0].mean]["steps"]} noisy steps per trial, Opacus `grad_sample_mode="ew"`, public '
            "validation data (no noisy score)."
        ),
        (
            f"* Search: K ~ Poisson(E[K]) drawn once per repetition; K configurations drawn uniformly (log-uniform for "
            f"ρ and C) from the paper's ranges ρ ∈ [10^-2.5, 10^1.5], C ∈ [10^-2, 10^2], γ ∈ [0.1, 0.9]; C_0 = "
            f"{CLIP_0} for `oso`, `quantile` and `fixed-lr-only`; OSO's ρ_c = ρ_r = 2.5e-3 and ν_q ≈ 7.124σ, quantile's "
            "η_C = 0.2 and σ_b = 64/20 (the papers' defaults). The best final selection accuracy is released; "
            f"K = 0 scores chance ({CHANCE}). {args.repeats} independent repetitions of each whole search, "
            f"seed {args.seed}."
        ),
        (
            f"* Privacy: σ per trial from `calibrate_noise_multiplier(plan_for, epsilon={args.epsilon}, delta={args.delta}, "
            "law=Poisson(E[K]))` for the trials' DP-SGD (q, steps), so that the whole search (`repeat_and_select`, Papernot & Steinke Thm 6) meets "
            "the target; every clipping mode is accounted as DP-SGD at σ (OSO by Galli et al.'s Proposition 1, "
            "quantile by Andrew et al.'s Theorem 1 with the count of sensitivity ½)."
        ),
        "",
        "| E[K] | σ per trial | whole-search ε | one trial's ε |",
        "|---|---|---|---|",
    ]
    for mean, cal in sigmas.items():
        lines.append(f"| {mean:g} | {cal['sigma']:.4f} | {cal['search_epsilon']:.4f} | {cal['trial_epsilon']:.3f} |")
    lines += [
        "",
        f"## Results (δ = {args.delta:g}, mean ± sd over {args.repeats} whole searches)",
        "",
        (
            "| arm | clipping | tuned | E[K] | mean K | σ | whole-search ε | best selection acc | its held-out acc "
            "| search time (s) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        s, cal = summary[arm.name], sigmas[arm.mean]
        lines.append(
            f"| `{arm.name}` | {arm.clipping} | {arm.tunes} | {arm.mean:g} | {s['k'].mean():.1f} | "
            f"{cal['sigma']:.3f} | {cal['search_epsilon']:.3f} | {_mean_sd(s['best'])} | {_mean_sd(s['held_out'])} | "
            f"{s['seconds'].mean():.1f} |"
        )
    lines += [
        "",
        (
            "Differences of the held-out accuracy of the released model (mean ± 1.96 standard errors; paired over "
            "repetitions where the arms share E[K], hence K and the draws):"
        ),
        "",
    ]
    oso_mean = next(arm.mean for arm in arms if arm.name == "oso")
    for other in [arm for arm in arms if arm.name != "oso"]:
        paired = other.mean == oso_mean
        delta, half = _gap(summary["oso"]["held_out"], summary[other.name]["held_out"], paired=paired)
        lines.append(
            f"* `oso` − `{other.name}`{' (paired)' if paired else ''}: {delta:+.3f} ± {half:.3f} "
            f"({_verdict(delta, half)})"
        )
    lines += ["", "## Verdict", "", *_verdict_text(arms, summary, args), "", "## What OSO's adaptation did", ""]
    oso_trials = summary["oso"]["trials"]
    if oso_trials:
        clip_moves = np.array([abs(np.log(t["clip"]["final_clip"] / CLIP_0)) for t in oso_trials])
        lr_moves = np.array([abs(np.log(t["clip"]["final_lr"] / t["config"]["lr"])) for t in oso_trials])
        steps = sigmas[arms[0].mean]["steps"]
        sigma_oso = sigmas[next(a.mean for a in arms if a.name == "oso")]["sigma"]
        q_noise = 7.124 * sigma_oso * np.sqrt(8714) / 64
        lines += [
            (
                f"Over {len(oso_trials)} OSO trials of {steps} steps, |log(C_T/C_0)| had median {np.median(clip_moves):.3f} "
                f"(max {clip_moves.max():.3f}) and |log(ρ_T/ρ_0)| median {np.median(lr_moves):.3f} (max "
                f"{lr_moves.max():.3f}); Eqs. (20)-(21) allow at most {steps * 2.5e-3:.3f}. The direction estimate q̃ "
                f"carries noise of norm ≈ ν_q·√d/|B| = 7.124·{sigma_oso:.2f}·√8714/64 ≈ {q_noise:.0f} against a signal "
                "of norm ≤ 1, so sign(g̃ᵀq̃) is close to a coin flip at this batch size and C_t performs a short random "
                "walk around C_0."
            ),
            "",
        ]
    lines += _selected_table(arms, summary)
    return "\n".join(lines) + "\n"


def _selected_table(arms: list[Arm], summary: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "## Released configurations (median over repetitions with K > 0)",
        "",
        "| arm | ρ (ρ_0) | C (C_0) | γ | final C |",
    ]
    lines.append("|---|---|---|---|---|")
    for arm in arms:
        chosen = summary[arm.name]["selected"]
        if not chosen:
            lines.append(f"| `{arm.name}` | – | – | – | – |")
            continue
        lr = np.median([t["config"]["lr"] for t in chosen])
        clip = np.median([t["config"]["max_grad_norm"] for t in chosen])
        gamma = np.median([t["config"]["target_quantile"] for t in chosen]) if "γ" in arm.tunes else None
        finals = [t["clip"]["final_clip"] for t in chosen if "final_clip" in t["clip"]]
        lines.append(
            f"| `{arm.name}` | {lr:.3g} | {clip:.3g} | {'–' if gamma is None else f'{gamma:.2f}'} | "
            f"{f'{np.median(finals):.3g}' if finals else '–'} |"
        )
    return lines


def provenance() -> dict[str, str]:
    import opacus
    import torch

    def git(*command: str) -> str:
        return subprocess.run(["git", *command], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()

    dirty = git("status", "--porcelain", "--", "benchmarks/oso.py", "ray_dptune/training")
    return {
        "command": shlex.join([".venv/bin/python", "benchmarks/oso.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": " (with uncommitted changes to benchmarks/oso.py or ray_dptune/training)" if dirty else "",
        "torch": torch.__version__,
        "load": ", ".join(f"{load:.1f}" for load in os.getloadavg()),
        "opacus": opacus.__version__,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=3.0, help="ε of each whole search (default 3)")
    parser.add_argument("--delta", type=float, default=1e-5, help="δ of each whole search (default 1e-5)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per trial (default 10)")
    parser.add_argument("--repeats", type=int, default=20, help="whole searches per arm (default 20)")
    parser.add_argument("--oso-mean", type=float, default=4.0, help="E[K] of the one-hyperparameter arms (default 4)")
    parser.add_argument("--two-d-mean", type=float, default=12.0, help="E[K] of the 2-D arms (default 12)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--seed", type=int, default=2024, help="seed of K, configurations and DP noise")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "oso.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    arms = default_arms(args.oso_mean, args.two_d_mean)
    environment = provenance()
    sigmas = calibrate(arms, args)
    tasks = tasks_for(arms, sigmas, args)
    draws = [t for t in tasks if t["config"] is None]
    trials = [t for t in tasks if t["config"] is not None]
    print(f"{len(trials)} trials over {len(arms)} arms × {args.repeats} repetitions", flush=True)
    with mp.get_context("spawn").Pool(args.workers, initializer=_init_worker) as pool:
        results = []
        for done, result in enumerate(pool.imap_unordered(run_trial, trials), start=1):
            results.append(result)
            if done % 20 == 0 or done == len(trials):
                print(f"  {done}/{len(trials)} trials, {time.perf_counter() - start:.0f} s", flush=True)
    summary = summarise(arms, results, draws)
    text = render(arms, sigmas, summary, args, time.perf_counter() - start, environment)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
