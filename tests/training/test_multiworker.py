"""A private search whose trials are 2-worker Ray Train TorchTrainers running distributed DP-SGD (gloo)."""

from __future__ import annotations

import sys
from pathlib import Path

from ray import cloudpickle, tune

from ray_dptune import Poisson, RandomCountSearcher, TrialSpend, private_tuner, release_best
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.result_keys import SPENT_KEY
from ray_dptune.training import opacus_plan

DELTA = 1e-5


def test_two_worker_trials_are_accounted_as_one_process_with_the_global_batch(ray_session, tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
    import multiworker_trial as example

    cloudpickle.register_pickle_by_value(example)  # Ray's workers do not have examples/ on their path
    law = Poisson(1.0)
    seed = next(s for s in range(100) if RandomCountSearcher(law, seed=s).num_trials == 1)
    searcher = RandomCountSearcher(law, metric="val_acc", mode="max", seed=seed)
    plan_for = opacus_plan(dataset_size=example.TRAIN_SIZE, batch_size=example.BATCH_SIZE, epochs=example.EPOCHS)
    trial = tune.with_resources(example.multiworker_trial(2, cpus_per_worker=0.5), {"cpu": 0.01})
    tuner = private_tuner(
        trial,
        param_space=example.SPACE,
        epsilon=3.0,
        delta=DELTA,
        searcher=searcher,
        plan_for=plan_for,
        run_config=tune.RunConfig(name="multiworker", storage_path=str(tmp_path), verbose=0),
        verbose=False,
    )
    results = tuner.fit()
    (result,) = results
    assert result.error is None and result.metrics["training_iteration"] == example.EPOCHS  # one report an epoch
    sigma = result.config["noise_multiplier"]
    single_process = plan_for(sigma)  # q = 1/⌈1437/64⌉ of the whole set, 3 epochs of global steps
    assert TrialSpend.from_dict(result.metrics[SPENT_KEY]) == single_process
    released = release_best(results)
    expected = SearchAccount(
        SearchMechanism.random_count(law=law, num_trials=1), delta=DELTA, plan=single_process.to_dict()
    ).guarantee(if_stopped_now=True)
    assert released.guarantee["epsilon"] == expected.epsilon <= 3.0
