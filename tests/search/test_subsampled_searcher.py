"""SubsampledTuningSearcher and its sample: K trials on one secret Poisson sample, then one final trial."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from ray import tune
from ray.tune.search import Searcher

from ray_dptune import PointMass, Poisson, RefusedBeforeTraining, tuning_sample
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.result_keys import NOISE_KEY, SAMPLE_KEY
from ray_dptune.search.subsampled import Extrapolation, SubsampledTuningSearcher
from ray_dptune.tuning_sample import TuningSample, planned_sample_size, tuning_sample_indices

FINAL = TrialSpend(sample_rate=0.05, noise_multiplier=1.2, steps=100)
FIXED = {"tuning_fraction": 0.1, "final_plan": FINAL, "final_noise_multiplier": 1.2}
SPACE = {"lr": tune.loguniform(0.1, 1.0), "max_grad_norm": tune.uniform(0.5, 2.0), "epochs": 2}


def searcher(k=3, mode="max", seed=0, **kwargs):
    law = PointMass(k) if k else Poisson(mean=0.5)
    if not k:  # a seed whose draw of K is 0
        seed = next(s for s in range(100) if SubsampledTuningSearcher(law, **FIXED, seed=s).num_trials == 1)
    built = SubsampledTuningSearcher(
        law, tuning_fraction=0.1, final_plan=FINAL, final_noise_multiplier=1.2, seed=seed, **kwargs
    )
    built.set_search_properties("acc", mode, dict(SPACE))
    return built


def tune_all(built, scores):
    configs = {}
    for index, score in enumerate(scores):
        configs[f"t{index}"] = built.suggest(f"t{index}")
    for index, score in enumerate(scores):
        if score == "error":
            built.on_trial_complete(f"t{index}", error=True)
        else:
            built.on_trial_complete(f"t{index}", {"acc": score})
    return configs


def test_every_tuning_trial_trains_on_one_sample_and_the_final_one_on_all_the_data():
    built = searcher()
    records = []
    built.attach_recorder(records.append)
    configs = tune_all(built, [0.5, 0.9, 0.7])
    samples = {TuningSample.from_config(config).seed for config in configs.values()}
    assert (
        len(samples) == 1
        and all(set(config[SAMPLE_KEY]) == {"sample_id", "fraction"} for config in configs.values())
        and all(config[SAMPLE_KEY]["fraction"] == 0.1 for config in configs.values())
    )
    final = built.suggest("final")
    assert SAMPLE_KEY not in final and final[NOISE_KEY] == 1.2 and built.final_trial(final)
    assert {key: final[key] for key in ("lr", "max_grad_norm", "epochs")} == {
        key: configs["t1"][key] for key in ("lr", "max_grad_norm", "epochs")
    }
    assert built.suggest("after") == Searcher.FINISHED
    assert [record.get("final", False) for record in records] == [False, False, False, True]
    assert built.privacy_details()["released_trial_id"] == "final"


def test_the_final_trial_waits_for_every_tuning_trial():
    built = searcher(k=2)
    built.suggest("t0"), built.suggest("t1")
    built.on_trial_complete("t0", {"acc": 0.4})
    assert built.suggest("final") is None
    built.on_trial_complete("t1", {"acc": 0.3})
    assert built.suggest("final")["lr"] == pytest.approx(built._suggested["t0"]["lr"])


@pytest.mark.parametrize(("mode", "scores", "best"), [("max", [0.5, "error", 0.2], 0), ("min", [0.5, "error", 0.2], 2)])
def test_the_best_by_the_mode_is_extrapolated_and_a_failed_trial_ranks_last(mode, scores, best):
    built = searcher(mode=mode, extrapolation=Extrapolation(learning_rate_scale=2.0))
    configs = tune_all(built, scores)
    final = built.suggest("final")
    assert final["lr"] == pytest.approx(2.0 * configs[f"t{best}"]["lr"])


def test_no_tuning_output_trains_a_configuration_drawn_before_the_data():
    built = searcher(k=0)
    final = built.suggest("final")
    assert SAMPLE_KEY not in final and 0.1 <= final["lr"] <= 1.0 and built.suggest("x") == Searcher.FINISHED
    failed = searcher(k=2, seed=5)
    tune_all(failed, ["error", "error"])
    assert SAMPLE_KEY not in failed.suggest("final")


def test_a_restored_searcher_keeps_the_sample_and_the_scores():
    built = searcher()
    configs = tune_all(built, [0.2, 0.8, 0.1])
    again = SubsampledTuningSearcher(
        PointMass(7), tuning_fraction=0.5, final_plan=FINAL, final_noise_multiplier=1.2, seed=9
    )
    state = pickle.loads(pickle.dumps(built.get_state()))
    tuning_sample._KEPT.clear()  # a new driver: nothing kept until the restored searcher keeps its sample again
    with pytest.raises(RefusedBeforeTraining):
        TuningSample.from_config(configs["t0"])
    again.set_state(state)
    assert TuningSample.from_config(configs["t0"]).seed == state["sample"]["seed"]
    assert again.tuning_fraction == 0.1 and again.privacy_mechanism() == built.privacy_mechanism()
    assert again.suggest("final")["lr"] == configs["t1"]["lr"]


def test_inconsistent_settings_are_refused_when_built():
    with pytest.raises(ValueError, match="differs from final_plan"):
        SubsampledTuningSearcher(PointMass(2), tuning_fraction=0.1, final_plan=FINAL, final_noise_multiplier=2.0)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        SubsampledTuningSearcher(PointMass(2), tuning_fraction=1.0, final_plan=FINAL, final_noise_multiplier=1.2)
    with pytest.raises(TypeError, match="TrialSpend"):
        SubsampledTuningSearcher(PointMass(2), tuning_fraction=0.1, final_plan={}, final_noise_multiplier=1.2)


def test_the_sample_is_poisson_of_rate_p_and_the_same_from_its_seed():
    sample = TuningSample.draw(0.1)
    n = 20_000
    indices = sample.indices(n)
    assert np.array_equal(indices, TuningSample(sample.seed, 0.1).indices(n))
    assert str(sample.seed) not in repr(sample) and str(sample.seed) not in str(sample.to_config())
    assert abs(len(indices) - 0.1 * n) < 5 * math.sqrt(n * 0.1 * 0.9)
    other = TuningSample.draw(0.1).indices(n)
    assert len(np.intersect1d(indices, other)) < 0.02 * n  # two secret seeds: independent samples
    # each position's coin does not depend on how many records follow it
    assert np.array_equal(sample.indices(n // 2), indices[indices < n // 2])


def test_the_planned_size_comes_from_n_alone_and_a_loop_of_your_own_reads_the_sample():
    assert planned_sample_size(0.1, 1437) == 144 and planned_sample_size(0.001, 10) == 1
    sample = TuningSample.draw(0.25)
    with pytest.raises(RefusedBeforeTraining, match="not kept"):  # no driver keeps its seed: no record is read
        tuning_sample_indices({SAMPLE_KEY: sample.to_config()}, 400)
    sample.keep()
    indices, planned = tuning_sample_indices({SAMPLE_KEY: sample.to_config()}, 400)
    assert planned == 100 and np.array_equal(indices, sample.indices(400))
    assert tuning_sample_indices({"lr": 0.1}, 400) is None
    with pytest.raises(ValueError, match="dp_tuning_sample"):
        TuningSample.from_config({SAMPLE_KEY: {"seed": 12, "fraction": 0.1}})
