"""private_tuner(tuning_fraction=...): tune on a secret sample, release one run on all the data."""

from __future__ import annotations

import json
import os

import pytest
import ray
from ray import tune

from ray_dptune import DPHyPOSearcher, PointMass, UnsupportedBoundError, private_tuner, release_best
from ray_dptune.accounting.bookkeeping.calibrate import (
    calibrate_noise_multiplier,
    calibrate_subsampled_tuning,
    search_epsilon,
)
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.result_keys import NOISE_KEY, SAMPLE_KEY
from ray_dptune.training import digits_cnn, digits_data, dp_trainable, opacus_plan
from ray_dptune.tuning_sample import TuningSample, planned_sample_size

DELTA = 1e-5
SPACE = {"lr": tune.loguniform(0.3, 1.0), "max_grad_norm": tune.uniform(0.5, 2.0)}
DIGITS_TRAIN = 1437


def trainable(**kwargs):
    return dp_trainable(digits_cnn, digits_data, batch_size=64, epochs=1, seed=0, **kwargs)


@pytest.mark.usefixtures("ray_session")
def test_a_subsampled_search_releases_one_run_on_all_the_data_and_keeps_the_sample_secret(tmp_path, monkeypatch):
    drawn = []
    draw = TuningSample.draw.__func__
    monkeypatch.setattr(
        TuningSample, "draw", classmethod(lambda cls, *a, **k: drawn.append(draw(cls, *a, **k)) or drawn[-1])
    )
    tuner = private_tuner(
        trainable(),
        param_space=SPACE,
        epsilon=3.0,
        delta=DELTA,
        law=PointMass(2),
        metric="val_acc",
        mode="max",
        tuning_fraction=0.25,
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="subsampled"),
        verbose=False,
    )
    results = tuner.fit()
    with open(os.path.join(results.experiment_path, "privacy_report.json")) as file:
        report = json.load(file)
    tuning = [result for result in results if SAMPLE_KEY in result.config]
    (final,) = [result for result in results if SAMPLE_KEY not in result.config]
    assert len(tuning) == 2 and len({result.config[SAMPLE_KEY]["sample_id"] for result in tuning}) == 1
    sigma_tuning, sigma_final = tuning[0].config[NOISE_KEY], final.config[NOISE_KEY]
    assert sigma_final < sigma_tuning
    # the tuning trials planned q on the sample's public size; the final run on all the data
    assert tuning[0].metrics["dp_plan"]["sample_rate"] == 64 / planned_sample_size(0.25, DIGITS_TRAIN)
    assert final.metrics["dp_plan"]["sample_rate"] == 64 / DIGITS_TRAIN
    best = max(tuning, key=lambda result: result.metrics["val_acc"])
    assert (final.config["lr"], final.config["max_grad_norm"]) == (best.config["lr"], best.config["max_grad_norm"])
    assert report["mechanism"]["kind"] == "subsampled_tuning" and 0.97 * 3.0 < report["guarantee"]["epsilon"] <= 3.0
    # the seed is in no config, log, folder name or result Ray wrote; the searcher's state holds it until the purge
    (sample,) = drawn
    forms = _written_forms(sample.seed)
    session = ray._private.worker._global_node.get_session_dir_path()
    holding = _files_holding(session, forms) + _files_holding(str(tmp_path), forms)
    saved_state = {"searcher-state", "tuner.pkl"}  # Tune's pickles of the searcher: the purge deletes them
    assert holding and {os.path.basename(path).split("-2")[0] for path in holding} <= saved_state, holding
    assert all(f"_{index}_" not in os.path.basename(result.path) for index in (1, 2, 3) for result in results)
    released = release_best(results, purge=True)
    assert released.trial_id == final.metrics["trial_id"] and SAMPLE_KEY not in released.config
    assert released.statement["guarantee"]["epsilon"] <= 3.0
    assert not _files_holding(results.experiment_path, forms) and not _files_holding(session, forms)


def _written_forms(seed: int) -> list[bytes]:
    """The seed as text (decimal, hexadecimal) and as a pickle's little-endian bytes."""
    return [str(seed).encode(), f"{seed:x}".encode(), seed.to_bytes((seed.bit_length() + 7) // 8, "little")]


def _files_holding(root: str, forms: list[bytes]) -> list[str]:
    holding = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                with open(path, "rb") as file:
                    content = file.read()
            except OSError:
                continue
            if any(form in content for form in forms):
                holding.append(path)
    return holding


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"searcher": DPHyPOSearcher(PointMass(2), upper=1.5, lower=0.75)}, ValueError, "give law="),
        (
            {"plan_for": lambda sigma: opacus_plan(dataset_size=1437, batch_size=64, epochs=1)(sigma)},
            ValueError,
            "opacus_plan",
        ),
        ({"tuning_fraction": 1.0}, ValueError, "tuning_fraction"),
        ({"ledger": object(), "dataset": "digits"}, UnsupportedBoundError, "without a ledger"),
        ({"trainable": trainable(score_noise_multiplier=50.0)}, ValueError, "public validation set"),
    ],
)
def test_a_subsampled_search_the_bound_does_not_cover_is_refused_before_any_trial(kwargs, error, message):
    arguments = {
        "trainable": trainable(),
        "param_space": SPACE,
        "epsilon": 3.0,
        "delta": DELTA,
        "law": PointMass(2),
        "metric": "val_acc",
        "mode": "max",
        "tuning_fraction": 0.1,
        "verbose": False,
        **kwargs,
    }
    if "searcher" in kwargs:
        arguments["law"] = None
    with pytest.raises(error, match=message):
        private_tuner(arguments.pop("trainable"), **arguments)


@pytest.mark.slow  # tens of privacy loss distributions
def test_the_split_meets_the_budget_and_leaves_the_final_run_near_an_untuned_one():
    def final_plan(sigma):
        return TrialSpend(sample_rate=64 / DIGITS_TRAIN, noise_multiplier=sigma, steps=9 * 22)

    def tuning_plan(sigma):
        return TrialSpend(sample_rate=64 / 144, noise_multiplier=sigma, steps=9 * 2)

    sigma_tuning, sigma_final = calibrate_subsampled_tuning(
        tuning_plan, final_plan, epsilon=3.0, delta=DELTA, law=PointMass(8), sample_rate=0.1
    )
    whole = SearchMechanism.subsampled_tuning(
        law=PointMass(8), num_trials=8, sample_rate=0.1, final_plan=final_plan(sigma_final)
    )
    assert 0.99 * 3.0 < search_epsilon(tuning_plan(sigma_tuning), delta=DELTA, mechanism=whole) <= 3.0
    untuned = calibrate_noise_multiplier(
        final_plan, epsilon=3.0, delta=DELTA, mechanism=SearchMechanism.halving(budget_units=1, max_t=1)
    )
    assert untuned < sigma_final <= 1.1 * untuned * 1.01 and sigma_tuning > 2 * sigma_final
