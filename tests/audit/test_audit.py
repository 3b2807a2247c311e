"""The one-run audit (Steinke, Nasr & Jagielski 2023): its bound, its canaries, its controls, its report.

- The bound: the numbers of an independent implementation (jax_privacy 2.0.0's
  ``auditing`` module, whose p-value is Theorem 3's), the closed form at δ = 0 with every
  guess right, and its exact false-alarm rate on ε-DP randomized response (W is exactly
  Binomial there), which must be at most 1 − confidence and not far below it.
- The controls (DP-SGD trials through the training loop, no Ray): no noise, secretly less
  noise than the plan, and honest noise.
- A private search through Ray: the report and the CLI show ε_lower beside ε_upper, the
  journal keeps the secret for a restore, and after a purge no other trial's counts and no
  file but the journal holds the secret.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3

import numpy as np
import pytest
import torch
from ray import tune
from scipy import stats
from scipy.optimize import brentq
from torch import nn
from torch.utils.data import TensorDataset

from ray_dptune import PointMass, private_tuner, release_best
from ray_dptune.accounting.bookkeeping.spend import TrialSpend, sampling_schedule
from ray_dptune.audit import AuditCounts, one_run_epsilon_lower, one_run_p_value, released_audit
from ray_dptune.cli.main import main as cli_main
from ray_dptune.training import CanaryAudit, CanaryScorer, digits_cnn, digits_data, dp_trainable
from ray_dptune.training.loop import train
from ray_dptune.training.plan import PrivacyParams
from ray_dptune.training.spec import TrainSpec
from ray_dptune.training.state import TrainState

DELTA = 1e-5

# jax_privacy 2.0.0, jax_privacy.auditing (p-value and its ε root; m canaries, r guesses, v right).
JAX_PRIVACY_EPSILON = [
    # (m, r, v, δ, ε_lower at 95 %)
    (1000, 100, 90, 1e-5, 1.6261436787042223),
    (1000, 100, 95, 1e-5, 2.165175787875041),
    (1000, 100, 100, 1e-5, 3.465376229385333),
    (1000, 100, 75, 1e-5, 0.6994669106155617),
    (1000, 100, 55, 1e-5, 0.0),
    (1000, 100, 95, 0.0, 2.172434019998109),
    (10000, 1000, 900, 1e-5, 2.015194451629058),
]


@pytest.mark.parametrize(("m", "r", "v", "delta", "expected"), JAX_PRIVACY_EPSILON)
def test_epsilon_lower_matches_jax_privacy(m, r, v, delta, expected):
    got = one_run_epsilon_lower(canaries=m, guesses=r, correct=v, delta=delta)
    assert got == pytest.approx(expected, rel=2e-7, abs=1e-12)  # jax_privacy's root is looser than ours
    if got > 0:  # ours is the root itself, from below: rejected at it, not just above it
        p = one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=got, delta=delta)
        assert p <= 0.05 < one_run_p_value(canaries=m, guesses=r, correct=v, epsilon=got + 1e-9, delta=delta)


def test_p_value_matches_jax_privacy_exactly():
    p = one_run_p_value(canaries=1000, guesses=100, correct=95, epsilon=2.0, delta=1e-5)
    assert p == pytest.approx(0.01782463464307135, rel=1e-12)


@pytest.mark.parametrize("guesses", [10, 100, 1000])
def test_every_guess_right_at_delta_zero_is_the_binomial_closed_form(guesses):
    # P[W >= r] = q^r with q = e^ε / (1 + e^ε): ε_lower = logit(0.05^(1/r)).
    accuracy = 0.05 ** (1 / guesses)
    expected = math.log(accuracy / (1 - accuracy))
    got = one_run_epsilon_lower(canaries=2 * guesses, guesses=guesses, correct=guesses, delta=0.0)
    assert got == pytest.approx(expected, rel=1e-9) and got <= expected


@pytest.mark.parametrize(
    ("epsilon", "guesses", "delta"),
    [(0.0, 50, 0.0), (1.0, 50, 1e-5), (2.0, 200, 1e-5), (0.5, 100, 0.0), (2.0, 200, 0.0)],
)
def test_false_alarm_rate_on_randomized_response_is_exactly_within_the_confidence(epsilon, guesses, delta):
    """ε-DP randomized response on each canary's bit: each guess is right with probability
    q = e^ε/(1+e^ε), independently, so W ~ Binomial(r, q) exactly. The audit may claim
    ε_lower > ε (a false alarm) with probability at most 5 %; at δ = 0 it is the binomial
    test, so the rate is not far below 5 % either (a bound weakened by one guess, or one
    made too timid, fails this)."""
    accuracy = 1 / (1 + math.exp(-epsilon))
    lowers = np.array(
        [
            one_run_epsilon_lower(canaries=4 * guesses, guesses=guesses, correct=v, delta=delta)
            for v in range(guesses + 1)
        ]
    )
    assert np.all(np.diff(lowers) >= 0)  # more right guesses never prove less
    false_alarm = float(stats.binom.pmf(np.flatnonzero(lowers > epsilon), guesses, accuracy).sum())
    assert false_alarm <= 0.05
    assert false_alarm > 0.015  # the test uses its level: ±1 guess moves the rate past one side or the other


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="correct <= guesses <= canaries"):
        one_run_epsilon_lower(canaries=10, guesses=20, correct=5, delta=DELTA)
    with pytest.raises(ValueError, match="correct must be an int"):
        one_run_p_value(canaries=10, guesses=5, correct=-1, epsilon=1.0, delta=DELTA)
    with pytest.raises(ValueError, match="confidence"):
        one_run_epsilon_lower(canaries=10, guesses=5, correct=5, delta=DELTA, confidence=1.0)
    with pytest.raises(ValueError, match="delta"):
        one_run_p_value(canaries=10, guesses=5, correct=5, epsilon=1.0, delta=2.0)


# ---------------------------------------------------------------------------------- canaries
def test_canaries_and_inclusion_come_from_the_secret_alone():
    audit = CanaryAudit(canaries=4000, num_classes=10, secret=12345)
    same = CanaryAudit(canaries=4000, num_classes=10, secret=12345)
    other = CanaryAudit(canaries=4000, num_classes=10, secret=54321)
    like = torch.zeros(1, 8, 8)
    assert np.array_equal(audit.inclusion(), same.inclusion())
    assert torch.equal(audit.examples(like).tensors[0], same.examples(like).tensors[0])
    assert not np.array_equal(audit.inclusion(), other.inclusion())
    assert audit.commitment == same.commitment != other.commitment
    included = audit.inclusion().sum()
    assert abs(included - 2000) < 4 * math.sqrt(1000)  # fair coins: sd sqrt(m/4)
    inputs, labels = audit.examples(like).tensors
    assert inputs.shape == (4000, 1, 8, 8) and 0 <= inputs.min() and inputs.max() <= 1
    assert set(labels.tolist()) == set(range(10))


def test_the_secret_never_shows():
    audit = CanaryAudit(canaries=10, num_classes=3)
    assert audit.secret.bit_length() > 64  # drawn from the secure source
    shown = repr(audit) + json.dumps(audit.record())
    assert str(audit.secret) not in shown and audit.commitment in shown
    assert "secret" not in audit.record() and audit.journal_record()["secret"] == str(audit.secret)


def test_training_set_appends_exactly_the_included_canaries():
    audit = CanaryAudit(canaries=50, num_classes=10, secret=7)
    train_set, _ = digits_data()
    audited = audit.training_set(train_set)
    inclusion = audit.inclusion()
    assert len(audited) == len(train_set) + inclusion.sum()
    inputs, labels = audit.examples(train_set[0][0]).tensors
    appended = [audited[len(train_set) + i] for i in range(int(inclusion.sum()))]
    for (x, y), index in zip(appended, np.flatnonzero(inclusion)):
        assert torch.equal(x, inputs[index]) and int(y) == int(labels[index])


def test_the_plan_does_not_depend_on_the_secret_coins():
    """q and the steps count every canary, inserted or not: the plan (released in the report) and the
    sampling are the same whichever canaries went in; the loader samples the real set plus the inserted."""
    trainable = dp_trainable(digits_cnn, digits_data, noise_multiplier=1.0, batch_size=64, epochs=2)
    space = {"lr": 0.5, "max_grad_norm": 1.0}
    audits = [CanaryAudit(canaries=40, num_classes=10, secret=secret) for secret in (1, 2, 3)]
    assert len({int(audit.inclusion().sum()) for audit in audits}) > 1
    plans = {trainable.with_audit(audit).privacy_plan(space) for audit in audits}
    (plan,) = plans
    assert plan.sample_rate == 64 / (1437 + 40) and plan.steps == 2 * int((1437 + 40) / 64)
    reports = []
    train(space, trainable.with_audit(audits[0]).spec, lambda metrics, _: reports.append(metrics))
    assert reports[-1]["dp_plan"] == plan.to_dict()


def test_count_guesses_in_for_the_lowest_losses_and_out_for_the_highest():
    audit = CanaryAudit(canaries=100, num_classes=10, guess_fraction=0.4, secret=3)
    inclusion = audit.inclusion()
    memorised = np.where(inclusion, 0.01, 5.0) + np.linspace(0, 1e-3, 100)
    assert audit.count(memorised) == AuditCounts(100, 40, 40, audit.commitment)
    assert audit.count(-memorised).correct == 0  # the opposite ranking gets every guess wrong
    flat = audit.count(np.ones(100))  # ties go by index, a rule that ignores the inclusion
    assert flat.correct == inclusion[:20].sum() + (~inclusion[-20:]).sum()
    assert audit.count(np.where(inclusion, np.nan, 1.0)).correct == 0  # a NaN loss ranks highest ("not fitted")
    with pytest.raises(ValueError, match="one score per canary"):
        audit.count(np.ones(99))


def test_bad_audits_are_refused():
    with pytest.raises(ValueError, match="canaries must be an int >= 2"):
        CanaryAudit(canaries=1, num_classes=10)
    with pytest.raises(ValueError, match="makes no guess each way"):
        CanaryAudit(canaries=4, num_classes=10, guess_fraction=0.2)
    with pytest.raises(ValueError, match="input_range"):
        CanaryAudit(canaries=10, num_classes=10, input_range=(1.0, 0.0))
    with pytest.raises(ValueError, match="confidence"):
        CanaryAudit(canaries=10, num_classes=10, confidence=1.0)


def test_with_audit_keeps_the_trainable_and_its_resources():
    trainable = tune.with_resources(
        dp_trainable(digits_cnn, digits_data, batch_size=64, epochs=1), {"cpu": 1, "gpu": 1}
    )
    audit = CanaryAudit(canaries=20, num_classes=10, secret=5)
    audited = trainable.with_audit(audit)
    assert audited.spec.audit is audit and trainable.spec.audit is None
    assert audited._resources == trainable._resources  # the GPU request survives
    assert audited.spec.model_fn is trainable.spec.model_fn and audited.__name__ == trainable.__name__


def test_released_audit_refuses_counts_of_other_canaries():
    audit = CanaryAudit(canaries=100, num_classes=10, secret=1)
    other = CanaryAudit(canaries=100, num_classes=10, secret=2)
    counts = AuditCounts(100, 20, 20, other.commitment).to_dict()
    section = released_audit(audit.record(), counts, epsilon_upper=3.0, delta=DELTA)
    assert section["epsilon_lower"] is None and "other canaries" in section["missing"]
    section = released_audit(audit.record(), None, epsilon_upper=3.0, delta=DELTA)
    assert section["epsilon_lower"] is None and "no counts" in section["missing"]
    ours = AuditCounts(100, 20, 20, audit.commitment).to_dict()
    section = released_audit(audit.record(), ours, epsilon_upper=1.0, delta=DELTA)
    expected = one_run_epsilon_lower(canaries=100, guesses=20, correct=20, delta=DELTA)
    assert section["epsilon_lower"] == expected > 1.0 and section["consistent"] is False  # above ε_upper: a bug


# ---------------------------------------------------------------------------------- controls
FEATURES, CLASSES = 200, 10


def gaussian_classes(config):
    """500 training and 100 validation points of 10 Gaussian classes in 200 dimensions (generated)."""
    rng = np.random.default_rng(0)
    means = rng.normal(size=(CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, 600)
    inputs = torch.as_tensor(means[labels] + rng.normal(size=(600, FEATURES)), dtype=torch.float32)
    labels = torch.as_tensor(labels)
    return TensorDataset(inputs[:500], labels[:500]), TensorDataset(inputs[500:], labels[500:])


def linear_model(config):
    return nn.Linear(FEATURES, CLASSES)


def audited_spec(audit, *, noise_multiplier, epochs=10, seed=0):
    return TrainSpec(
        model_fn=linear_model,
        data_fn=gaussian_classes,
        loss_fn=torch.nn.functional.cross_entropy,
        privacy=PrivacyParams(noise_multiplier=noise_multiplier, batch_size=50, epochs=epochs),
        audit=audit,
        seed=seed,
    )


def audited_run(audit, *, noise_multiplier, max_grad_norm, epochs=10, lr=0.5, seed=0):
    """One DP-SGD trial (batch 50) on the generated data with ``audit``: its counts and its own ε."""
    spec = audited_spec(audit, noise_multiplier=noise_multiplier, epochs=epochs, seed=seed)
    reports = []
    spent = train({"lr": lr, "max_grad_norm": max_grad_norm}, spec, lambda metrics, _: reports.append(metrics))
    assert all("dp_audit" not in metrics for metrics in reports[:-1])  # only the released model is audited
    return AuditCounts.from_dict(reports[-1]["dp_audit"]), spent


def plan_epsilon(audit, noise_multiplier, epochs=10):
    size = 500 + audit.canaries  # every canary counted, inserted or not
    sample_rate, steps = sampling_schedule(size, 50)
    return (
        TrialSpend(sample_rate=sample_rate, noise_multiplier=noise_multiplier, steps=epochs * steps)
        .curve()
        .epsilon(delta=DELTA)
    )


@pytest.mark.parametrize("method", ["black-box", "white-box"])
def test_no_noise_is_caught_above_the_budget_it_would_claim(method):
    """σ ≈ 0 (a deliberately non-private control): 200 canaries, 100 guesses, (nearly) all right:
    ε_lower above the ε = 3 a search of the quickstart's budget claims (benchmarks/audit.py: the smallest m)."""
    audit = CanaryAudit(
        canaries=200, num_classes=CLASSES, guess_fraction=0.5, input_range=(-1.0, 1.0), method=method, secret=11
    )
    counts, _ = audited_run(audit, noise_multiplier=1e-3, max_grad_norm=100.0)
    assert counts.guesses == 100 and counts.correct >= 99 and counts.method == method
    assert counts.epsilon_lower(delta=DELTA) > 3.0


def test_secretly_less_noise_than_the_plan_is_flagged():
    """The plan says σ = 2 (ε ≈ 2.3 is the claim); the trainable adds σ/100: flagged, ε_lower above the claim."""
    audit = CanaryAudit(canaries=200, num_classes=CLASSES, guess_fraction=0.5, input_range=(-1.0, 1.0), secret=12)
    claimed = plan_epsilon(audit, 2.0)
    counts, _ = audited_run(audit, noise_multiplier=0.02, max_grad_norm=100.0)
    assert counts.epsilon_lower(delta=DELTA) > claimed


@pytest.mark.parametrize("method", ["black-box", "white-box"])
@pytest.mark.parametrize("claimed", [3.0, 8.0])
def test_honest_noise_stays_below_its_proven_epsilon(claimed, method):
    audit = CanaryAudit(
        canaries=200, num_classes=CLASSES, guess_fraction=0.5, input_range=(-1.0, 1.0), method=method, secret=13
    )
    noise_multiplier = brentq(lambda sigma: plan_epsilon(audit, sigma) - claimed, 0.3, 10.0, xtol=1e-6) * 1.001
    counts, spent = audited_run(audit, noise_multiplier=noise_multiplier, max_grad_norm=100.0)
    proven = spent.curve().epsilon(delta=DELTA)
    assert proven == pytest.approx(plan_epsilon(audit, noise_multiplier)) and proven <= claimed
    assert counts.epsilon_lower(delta=DELTA) <= proven


# ---------------------------------------------------------------------------------- a search
@pytest.mark.usefixtures("ray_session")
def test_an_audited_search_reports_epsilon_lower_beside_epsilon_upper(tmp_path, capsys):
    audit = CanaryAudit(canaries=100, num_classes=10, guess_fraction=0.4)
    trainable = dp_trainable(digits_cnn, digits_data, batch_size=128, epochs=1, seed=0)
    tuner = private_tuner(
        trainable,
        param_space={"lr": tune.loguniform(0.3, 1.0), "max_grad_norm": 1.0},
        epsilon=3.0,
        delta=DELTA,
        law=PointMass(2),
        metric="val_acc",
        mode="max",
        audit=audit,
        run_config=tune.RunConfig(name="audited", storage_path=str(tmp_path), verbose=0),
        verbose=False,
    )
    space = tuner._local_tuner.param_space
    planned_size = len(digits_data()[0]) + 100  # all canaries, inserted or not: q does not depend on the coins
    assert trainable.with_audit(audit).dataset_size(space) == planned_size  # σ calibrated at that size
    results = tuner.fit()
    experiment = results.experiment_path
    counts = [AuditCounts.from_dict(result.metrics["dp_audit"]) for result in results]
    assert {c.commitment for c in counts} == {audit.commitment} and all(c.guesses == 40 for c in counts)
    with sqlite3.connect(os.path.join(experiment, "privacy_journal.db")) as db:
        (record,) = db.execute("SELECT record FROM search").fetchone()
    assert json.loads(record)["audit"] == audit.journal_record()  # journaled before the trials, secret included
    rebuilt = CanaryAudit.from_journal(experiment)  # what a restore after a killed driver inserts
    assert rebuilt.commitment == audit.commitment and np.array_equal(rebuilt.inclusion(), audit.inclusion())

    with pytest.raises(SystemExit) as refused:  # nothing released yet: no ε_lower to show
        cli_main(["audit", experiment])
    assert refused.value.code == 1 and "run release_best" in capsys.readouterr().err
    released = release_best(results, purge=True)
    with open(os.path.join(experiment, "privacy_report.json")) as file:
        section = json.load(file)["audit"]
    chosen = next(c for c, r in zip(counts, results) if r.config == released.config)
    assert section["correct"] == chosen.correct and section["guesses"] == 40
    assert section["epsilon_lower"] == chosen.epsilon_lower(delta=DELTA)
    assert section["epsilon_upper"] == released.guarantee["epsilon"] <= 3.0
    assert section["consistent"] is True and section["epsilon_lower"] <= section["epsilon_upper"]

    assert cli_main(["audit", experiment]) == 0
    printed = capsys.readouterr().out
    assert f"ε_upper = {released.guarantee['epsilon']:.4g}" in printed
    assert f"ε_lower = {section['epsilon_lower']:.4g} at 95% confidence" in printed
    assert cli_main(["audit", experiment, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == section
    plot = tmp_path / "audit.png"
    assert cli_main(["audit", experiment, "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    secret = str(audit.secret)
    holding = set()
    for folder, _, files in os.walk(experiment):  # after the purge: the secret in the journal alone
        for name in files:
            with open(os.path.join(folder, name), "rb") as file:
                if secret.encode() in file.read():
                    holding.add(name)
    assert holding and all(name.startswith("privacy_journal.db") for name in holding), holding
    remaining = {name for name in os.listdir(experiment) if os.path.isdir(os.path.join(experiment, name))}
    assert len(remaining) == 1  # the released trial's folder only


def test_a_white_box_trial_resumed_from_its_checkpoint_audits_as_if_never_stopped():
    """The initial weights travel in every checkpoint, so a restored trial scores against the same θ₀."""
    audit = CanaryAudit(canaries=60, num_classes=CLASSES, guess_fraction=0.5, method="white-box", secret=21)
    spec = audited_spec(audit, noise_multiplier=0.5, epochs=3, seed=4)
    config = {"lr": 0.5, "max_grad_norm": 5.0}
    states, reports = [], []

    def keep(metrics, directory):
        reports.append(metrics)
        states.append(TrainState.load(directory))

    train(config, spec, keep)
    whole = reports[-1]["dp_audit"]
    first = states[0]
    assert first.initial_model_state is not None and not torch.equal(
        first.initial_model_state["weight"], first.model_state["weight"]
    )
    assert all(
        torch.equal(state.initial_model_state["weight"], first.initial_model_state["weight"]) for state in states
    )
    resumed = []
    train(config, spec, lambda metrics, _: resumed.append(metrics), resume=first)
    assert resumed[-1]["dp_audit"] == whole
    black_box = audited_spec(CanaryAudit(canaries=60, num_classes=CLASSES, secret=21), noise_multiplier=0.5, epochs=1)
    plain = []
    train(config, black_box, lambda metrics, directory: plain.append(TrainState.load(directory)))
    assert plain[0].initial_model_state is None  # kept only for a white-box audit


def test_a_loop_of_your_own_scores_with_canary_scorer():
    """What a user's own Opacus loop does: train on audit.training_set, sample at planned_size, score."""
    audit = CanaryAudit(canaries=40, num_classes=CLASSES, guess_fraction=0.5, input_range=(-1.0, 1.0), secret=8)
    train_set, _ = gaussian_classes({})
    audited = audit.training_set(train_set)
    assert audit.planned_size(len(train_set)) == 540 and len(audited) == 500 + audit.inclusion().sum()
    model = linear_model({})
    with torch.no_grad():  # a model that has memorised exactly the inserted canaries: every guess right
        inputs, labels = audit.examples(train_set[0][0]).tensors
        model.weight.zero_()
        model.bias.zero_()
        for x, y in zip(inputs[audit.inclusion()], labels[audit.inclusion()]):
            model.weight[y] += 10 * x
    scorer = CanaryScorer(audit, like=train_set[0][0], loss_fn=torch.nn.functional.cross_entropy, start=None)
    assert scorer.counts(model) == AuditCounts(40, 20, 20, audit.commitment)
    with pytest.raises(ValueError, match="leave start= None"):
        CanaryScorer(audit, like=train_set[0][0], loss_fn=torch.nn.functional.cross_entropy, start=model)
    white = CanaryAudit(canaries=40, num_classes=CLASSES, method="white-box", secret=8)
    with pytest.raises(ValueError, match="pass start="):
        CanaryScorer(white, like=train_set[0][0], loss_fn=torch.nn.functional.cross_entropy, start=None)
