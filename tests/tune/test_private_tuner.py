"""private_tuner: a budget for the whole search in, a calibrated tune.Tuner out."""

from __future__ import annotations

import json
import os

import pytest
from ray import tune

from ray_dptune import (
    ConstantOverheadSearcher,
    DPBOSearcher,
    DPHyPOSearcher,
    PointMass,
    Poisson,
    PrivacyError,
    TruncatedNegativeBinomial,
    UnsupportedBoundError,
    private_tuner,
    release_best,
)
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.training import digits_cnn, digits_data, dp_trainable

DELTA = 1e-5
SPACE = {"lr": tune.loguniform(0.3, 1.0), "max_grad_norm": tune.uniform(0.5, 2.0)}


def trainable(**kwargs):
    return dp_trainable(digits_cnn, digits_data, batch_size=128, epochs=1, seed=0, **kwargs)


def test_bad_input_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="exactly one of law= .* and searcher="):
        private_tuner(trainable(), param_space=SPACE, epsilon=3.0, delta=DELTA)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        private_tuner(trainable(), param_space=SPACE, epsilon=float("nan"), delta=DELTA, law=PointMass(2))
    with pytest.raises(ValueError, match="delta must lie strictly between 0 and 1"):
        private_tuner(trainable(), param_space=SPACE, epsilon=3.0, delta=0.0, law=PointMass(2))
    with pytest.raises(ValueError, match="must not set 'noise_multiplier'"):
        private_tuner(
            trainable(), param_space={**SPACE, "noise_multiplier": 1.0}, epsilon=3.0, delta=DELTA, law=PointMass(2)
        )
    with pytest.raises(UnsupportedBoundError, match="validation set"):
        private_tuner(
            trainable(), param_space=SPACE, epsilon=3.0, delta=DELTA, searcher=DPBOSearcher(3, epsilon=1.0, delta=1e-7)
        )
    with pytest.raises(PrivacyError, match="num_samples=4 would cap"):
        private_tuner(
            trainable(),
            param_space=SPACE,
            epsilon=3.0,
            delta=DELTA,
            law=PointMass(2),
            tune_config=tune.TuneConfig(num_samples=4),
        )
    for rule in ({"metric": "val_acc"}, {"mode": "max"}):
        with pytest.raises(PrivacyError, match="no selection rule"):  # refused before σ is even calibrated
            private_tuner(trainable(), param_space=SPACE, epsilon=3.0, delta=DELTA, law=PointMass(2), **rule)
    with pytest.raises(ValueError, match="reports its validation accuracy as 'val_acc'"):  # a misspelled metric
        private_tuner(
            trainable(),
            param_space=SPACE,
            epsilon=3.0,
            delta=DELTA,
            law=PointMass(2),
            metric="val_accuracy",
            mode="max",
        )
    with pytest.raises(ValueError, match="must not set 'dp_search_plan'"):
        private_tuner(
            trainable(), param_space={**SPACE, "dp_search_plan": "{}"}, epsilon=3.0, delta=DELTA, law=PointMass(2)
        )
    with pytest.raises(ValueError, match="metric='val_acc' differs from tune_config.metric='loss'"):
        conflicting = {"metric": "val_acc", "tune_config": tune.TuneConfig(metric="loss", mode="min")}
        private_tuner(trainable(), param_space=SPACE, epsilon=3.0, delta=DELTA, law=PointMass(2), **conflicting)
    with pytest.raises(ValueError, match="not in tune_config.search_alg"):
        private_tuner(
            trainable(),
            param_space=SPACE,
            epsilon=3.0,
            delta=DELTA,
            law=PointMass(2),
            tune_config=tune.TuneConfig(search_alg=DPHyPOSearcher(PointMass(2))),
        )


@pytest.mark.slow
def test_a_budget_no_noise_can_meet_is_refused_before_training():
    noisy_scores = trainable(score_noise_multiplier=0.05)  # each epoch's score alone costs more than ε = 1
    with pytest.raises(PrivacyError, match="No noise multiplier up to 10000 meets ε = 1.0"):
        private_tuner(
            noisy_scores, param_space=SPACE, epsilon=1.0, delta=DELTA, law=Poisson(mean=4), metric="val_acc", mode="max"
        )


@pytest.mark.slow
@pytest.mark.parametrize("law", [PointMass(3), Poisson(mean=8)], ids=["point-mass", "poisson"])
def test_the_calibrated_search_meets_the_budget_tightly(law):
    tuner = private_tuner(
        trainable(), param_space=SPACE, epsilon=3.0, delta=DELTA, law=law, metric="val_acc", mode="max"
    )
    space = tuner._local_tuner.param_space  # the Tuner as built (read back, not re-derived)
    sigma = space["noise_multiplier"]
    plan = trainable().privacy_plan(space)
    mechanism = SearchMechanism.random_count(law=law, num_trials=1)
    spent = SearchAccount(mechanism, delta=DELTA, plan=plan.to_dict()).guarantee().epsilon
    assert 3.0 * 0.99 < spent <= 3.0
    less_noise = trainable().privacy_plan({**space, "noise_multiplier": sigma * (1 - 2e-3)})
    assert SearchAccount(mechanism, delta=DELTA, plan=less_noise.to_dict()).guarantee().epsilon > 3.0


def _fit(tmp_path, name, **kwargs):
    tuner = private_tuner(
        trainable(),
        param_space=kwargs.pop("param_space", SPACE),
        delta=DELTA,
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
        verbose=False,
        **kwargs,
    )
    results = tuner.fit()
    with open(os.path.join(results.experiment_path, "privacy_report.json")) as file:
        return results, json.load(file)


@pytest.mark.usefixtures("ray_session")
def test_random_count_search_end_to_end(tmp_path):
    results, report = _fit(tmp_path, "random", epsilon=3.0, law=PointMass(2), metric="val_acc", mode="max")
    assert len(results) == 2 and all(r.error is None for r in results)
    assert 0.99 * 3.0 < report["guarantee"]["epsilon"] <= 3.0
    released = release_best(results)
    assert released.guarantee["epsilon"] <= 3.0 and released.score > 0.2
    # Tune's own restore works with the user's (uncalibrated) trainable: σ is in the param_space
    again = tune.Tuner.restore(results.experiment_path, trainable()).fit()
    assert sorted(r.config["lr"] for r in again) == sorted(r.config["lr"] for r in results)


@pytest.mark.usefixtures("ray_session")
def test_dp_hypo_search_end_to_end(tmp_path):
    law = TruncatedNegativeBinomial.from_mean(eta=1.0, mean=2.0)
    seed = next(s for s in range(1000) if DPHyPOSearcher(law, upper=1.5, lower=0.75, seed=s).num_trials == 2)
    searcher = DPHyPOSearcher(law, upper=1.5, lower=0.75, metric="val_acc", mode="max", seed=seed)
    results, report = _fit(tmp_path, "dphypo", epsilon=6.0, searcher=searcher)
    assert len(results) == 2 and report["searcher"] == "DPHyPOSearcher"
    assert report["guarantee"]["epsilon_adaptivity"] > 0  # DP-HyPO Thm 1 charges the density ratio
    assert 0.99 * 6.0 < report["guarantee"]["epsilon"] <= 6.0


@pytest.mark.usefixtures("ray_session")
def test_constant_overhead_search_end_to_end(tmp_path):
    searcher = ConstantOverheadSearcher(
        [{"lr": 0.5, "max_grad_norm": 1.0}, {"lr": 1.0, "max_grad_norm": 1.0}],
        partitions=2,
        epsilon_round=0.1,
        granularity=0.1,
        metric="val_acc",
        seed=0,
    )
    results, report = _fit(tmp_path, "overhead", param_space={}, epsilon=8.0, searcher=searcher)
    assert len(results) == 2 * 2 + 1 and report["searcher"] == "ConstantOverheadSearcher"
    assert 0.99 * 8.0 < report["guarantee"]["epsilon"] <= 8.0
