"""Bring your own Opacus loop: OpacusSpend reports what Opacus's own accountant saw run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from opacus.optimizers import AdaClipDPOptimizer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ray_dptune import PrivacyError, RefusedBeforeTraining, TrialSpend
from ray_dptune.accounting import RDPCurve
from ray_dptune.accounting.bookkeeping.spend import report_covers
from ray_dptune.result_keys import PLAN_KEY, SAMPLE_KEY, SEARCH_PLAN_KEY, SPENT_KEY
from ray_dptune.training import OpacusSpend, opacus_plan, tuning_loader

DELTA = 1e-5
N, FEATURES, BATCH = 200, 5, 16


def make_private(*, poisson_sampling: bool = True, noise_multiplier: float = 1.3, size: int = N, batch: int = BATCH):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(size, FEATURES), torch.randint(0, 2, (size,)))
    model = nn.Linear(FEATURES, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=DataLoader(data, batch_size=batch),
        noise_multiplier=noise_multiplier,
        max_grad_norm=1.0,
        poisson_sampling=poisson_sampling,
    )
    return engine, model, optimizer, loader


def run_steps(model, optimizer, loader, count: int) -> int:
    """Takes ``count`` optimizer steps; returns how many ran (the side record)."""
    taken = 0
    while taken < count:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            taken += 1
            if taken == count:
                break
    return taken


def test_spend_is_what_opacus_accountant_saw_and_matches_its_epsilon():
    engine, model, optimizer, loader = make_private()
    spend = OpacusSpend(engine, optimizer, loader, steps=3 * len(loader))
    assert spend.spent() == TrialSpend(sample_rate=1 / len(loader), noise_multiplier=1.3, steps=0)
    taken = run_steps(model, optimizer, loader, 23)
    spent = spend.spent()
    # an independent recomputation from Opacus's own history: one (σ, q, steps) entry, steps = what ran
    ((sigma, rate, steps),) = engine.accountant.history
    assert spent == TrialSpend(sample_rate=rate, noise_multiplier=sigma, steps=steps) and steps == taken == 23
    assert spend.plan.covers(spent) and not spent.covers(spend.plan)
    theirs = engine.accountant.get_epsilon(delta=DELTA)  # Opacus's RDP accountant on its own orders
    assert spent.curve().epsilon(delta=DELTA) == pytest.approx(theirs, rel=1e-2)  # the same analysis
    report = spend.report()
    assert TrialSpend.from_dict(report[SPENT_KEY]) == spent and TrialSpend.from_dict(report[PLAN_KEY]) == spend.plan


@pytest.mark.slow
def test_a_noise_change_mid_run_is_composed_as_it_ran():
    engine, model, optimizer, loader = make_private()
    spend = OpacusSpend(engine, optimizer, loader, steps=40)
    run_steps(model, optimizer, loader, 5)
    optimizer.noise_multiplier = 0.9  # less noise for the next steps: costlier than the plan
    run_steps(model, optimizer, loader, 7)
    spent = spend.spent()
    q = 1 / len(loader)
    expected = RDPCurve.subsampled_gaussian(
        sample_rate=q, noise_multiplier=1.3, steps=5
    ) + RDPCurve.subsampled_gaussian(sample_rate=q, noise_multiplier=0.9, steps=7)
    assert spent == expected
    assert spent.epsilon(delta=DELTA) == pytest.approx(engine.accountant.get_epsilon(delta=DELTA), rel=1e-2)
    assert not report_covers(spend.plan.to_dict(), spent.to_dict())  # the accountant callback refuses this trial


def test_more_noise_mid_run_is_reported_as_plan_steps():
    engine, model, optimizer, loader = make_private()
    spend = OpacusSpend(engine, optimizer, loader, steps=40)
    run_steps(model, optimizer, loader, 5)
    optimizer.noise_multiplier = 2.0  # more noise: each step is a post-processing of a plan step
    run_steps(model, optimizer, loader, 7)
    assert len(engine.accountant.history) == 2
    assert spend.spent() == TrialSpend(sample_rate=1 / len(loader), noise_multiplier=1.3, steps=12)
    assert report_covers(spend.plan.to_dict(), spend.spent().to_dict())


@pytest.mark.parametrize("size, batch", [(N, BATCH), (930, 10)])  # 930/10: Opacus runs 92 batches, not 93
def test_opacus_plan_is_the_plan_the_trial_reports(size, batch):
    engine, _, optimizer, loader = make_private(noise_multiplier=2.0, size=size, batch=batch)
    plan_for = opacus_plan(dataset_size=size, batch_size=batch, epochs=3)
    assert plan_for(2.0) == OpacusSpend(engine, optimizer, loader, steps=3 * len(loader)).plan


def test_unaccountable_configurations_are_refused():
    engine, _, optimizer, loader = make_private(poisson_sampling=False)
    with pytest.raises(PrivacyError, match="Poisson"):
        OpacusSpend(engine, optimizer, loader, steps=10)
    engine, model, optimizer, loader = make_private()
    with pytest.raises(PrivacyError, match="history"):
        OpacusSpend(object(), optimizer, loader, steps=10)
    with pytest.raises(TypeError, match="DPOptimizer"):
        OpacusSpend(engine, torch.optim.SGD(model.parameters(), lr=0.1), loader, steps=10)
    adaptive = AdaClipDPOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        expected_batch_size=BATCH,
        target_unclipped_quantile=0.5,
        clipbound_learning_rate=0.2,
        max_clipbound=10.0,
        min_clipbound=0.1,
        unclipped_num_std=BATCH / 20,
    )
    with pytest.raises(PrivacyError, match="AdaClip"):
        OpacusSpend(engine, adaptive, loader, steps=10)
    with pytest.raises(ValueError, match="steps must be a non-negative integer"):
        OpacusSpend(engine, optimizer, loader, steps=-1)


def config_for(plan: TrialSpend) -> dict:
    return {"noise_multiplier": plan.noise_multiplier, SEARCH_PLAN_KEY: json.dumps(plan.to_dict())}


def test_opacus_spend_refuses_a_loader_past_the_search_plan_before_the_first_step():
    engine, model, optimizer, loader = make_private(noise_multiplier=1.3)
    steps = 2 * len(loader)
    right = opacus_plan(dataset_size=N, batch_size=BATCH, epochs=2)(1.3)
    assert OpacusSpend(engine, optimizer, loader, steps=steps, config=config_for(right)).plan == right
    assert OpacusSpend(engine, optimizer, loader, steps=steps, config={}).plan == right  # no search plan: no check
    train_and_validation = opacus_plan(dataset_size=N + 60, batch_size=BATCH, epochs=2)(1.3)
    with pytest.raises(RefusedBeforeTraining, match=r"sample_rate 0\.0769231 \(larger than the plan's 0\.0588235\)"):
        OpacusSpend(engine, optimizer, loader, steps=steps, config=config_for(train_and_validation))
    with pytest.raises(RefusedBeforeTraining, match=r"noise_multiplier 1\.3 \(smaller than the plan's 1\.5\)"):
        OpacusSpend(
            engine,
            optimizer,
            loader,
            steps=steps,
            config=config_for(opacus_plan(dataset_size=N, batch_size=BATCH, epochs=2)(1.5)),
        )
    with pytest.raises(RefusedBeforeTraining, match="steps 39 .more than the plan's 26."):
        OpacusSpend(engine, optimizer, loader, steps=3 * len(loader), config=config_for(right))
    x, y = next(iter(loader))
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()  # one step ran: no longer "before training"
    with pytest.raises(PrivacyError, match="Steps have already run") as raised:
        OpacusSpend(engine, optimizer, loader, steps=steps, config=config_for(train_and_validation))
    assert not isinstance(raised.value, RefusedBeforeTraining)


def test_the_byo_example_runs_a_private_search_within_budget(ray_session, tmp_path):
    """The example's plain Opacus loop through private_tuner: every trial ran its plan, ε within budget."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
    import byo_opacus_loop as example
    from ray import cloudpickle, tune

    cloudpickle.register_pickle_by_value(example)  # Ray's workers do not have examples/ on their path

    from ray_dptune import Poisson, RandomCountSearcher, private_tuner, release_best

    searcher = RandomCountSearcher(Poisson(2.0), metric="val_acc", mode="max", seed=4)
    plan_for = opacus_plan(dataset_size=example.TRAIN_SIZE, batch_size=example.BATCH_SIZE, epochs=example.EPOCHS)
    tuner = private_tuner(
        example.train_breast_cancer,
        param_space=example.SPACE,
        epsilon=2.0,
        delta=DELTA,
        searcher=searcher,
        plan_for=plan_for,
        run_config=tune.RunConfig(name="byo", storage_path=str(tmp_path), verbose=0),
        verbose=False,
    )
    results = tuner.fit()
    assert len(results) == searcher.num_trials >= 1
    sigma = results[0].config["noise_multiplier"]
    for result in results:
        assert TrialSpend.from_dict(result.metrics[SPENT_KEY]) == plan_for(sigma)  # every planned step ran
    released = release_best(results)
    assert released.guarantee["epsilon"] <= 2.0
    assert released.score == max(result.metrics["val_acc"] for result in results)
    shown = repr(released)  # a short summary, not the guarantee's curve of hundreds of orders
    assert f"ε={released.guarantee['epsilon']:.4g}, δ=1e-05" in shown and "orders" not in shown and len(shown) < 400


def test_the_byo_example_tunes_on_a_sample_and_trains_once_on_all_the_data(ray_session, tmp_path):
    """The same loop, tuning_fraction=: the tuning trials ran the sample's plan, the final one the full plan."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
    import byo_opacus_loop as example
    from ray import cloudpickle, tune

    cloudpickle.register_pickle_by_value(example)

    from ray_dptune import PointMass, private_tuner, release_best

    plan_for = opacus_plan(dataset_size=example.TRAIN_SIZE, batch_size=example.BATCH_SIZE, epochs=example.EPOCHS)
    tuner = private_tuner(
        example.train_breast_cancer,
        param_space=example.SPACE,
        epsilon=3.0,
        delta=DELTA,
        law=PointMass(2),
        metric="val_acc",
        mode="max",
        plan_for=plan_for,
        tuning_fraction=0.3,
        run_config=tune.RunConfig(name="byo_sample", storage_path=str(tmp_path), verbose=0),
        verbose=False,
    )
    results = tuner.fit()
    tuning = [result for result in results if SAMPLE_KEY in result.config]
    (final,) = [result for result in results if SAMPLE_KEY not in result.config]
    assert len(tuning) == 2 and all(result.error is None for result in results)
    on_sample = plan_for.on_sample(0.3)
    for result in tuning:  # every planned step ran, at the sample's planned q
        assert TrialSpend.from_dict(result.metrics[SPENT_KEY]) == on_sample(result.config["noise_multiplier"])
    assert TrialSpend.from_dict(final.metrics[SPENT_KEY]) == plan_for(final.config["noise_multiplier"])
    released = release_best(results)
    assert released.config["lr"] == max(tuning, key=lambda result: result.metrics["val_acc"]).config["lr"]
    assert released.guarantee["epsilon"] <= 3.0 and SAMPLE_KEY not in released.config


def test_the_tuning_loader_samples_at_the_planned_rate_whatever_the_sample_s_size():
    from ray_dptune.tuning_sample import TuningSample

    train = TensorDataset(torch.zeros(455, 3), torch.zeros(455, dtype=torch.long))
    plan = opacus_plan(dataset_size=455, batch_size=32, epochs=1)
    for seed in range(20):
        sample = TuningSample.draw(0.3, rng=np.random.default_rng(seed))
        sample.keep()
        loader = tuning_loader(train, {SAMPLE_KEY: sample.to_config()}, batch_size=32)
        assert loader.sample_rate == plan.on_sample(0.3)(1.0).sample_rate  # from m = 136, not the realised size
        assert len(loader.dataset) == len(sample.indices(455))
    plain = tuning_loader(train, {"lr": 0.1}, batch_size=32)
    assert type(plain) is DataLoader and plain.batch_size == 32 and len(plain.dataset) == 455


def test_a_loop_planned_on_train_plus_validation_is_refused_before_any_step_and_spends_nothing(ray_session, tmp_path):
    """The commonest slip of a loop of one's own: every trial stops before its first step; the search is free."""
    from ray import tune

    from ray_dptune import PointMass, RandomCountSearcher, private_tuner
    from ray_dptune.records.ledger import PrivacyLedger

    side = tmp_path / "steps"

    def loop(config):
        engine, model, optimizer, loader = make_private(noise_multiplier=config["noise_multiplier"])
        spend = OpacusSpend(engine, optimizer, loader, steps=2 * len(loader), config=config)
        for x, y in loader:
            with open(side, "a") as file:
                file.write("step\n")  # before every optimizer step: what the test reads
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        tune.report({"score": 0.5, **spend.report()})

    ledger = PrivacyLedger(tmp_path / "ledger.db")
    tuner = private_tuner(
        loop,
        param_space={"lr": tune.uniform(0.01, 0.1)},
        epsilon=2.0,
        delta=DELTA,
        searcher=RandomCountSearcher(PointMass(3), metric="score", mode="max", seed=0),
        plan_for=opacus_plan(dataset_size=N + 60, batch_size=BATCH, epochs=2),  # train + validation
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(name="slip", storage_path=str(tmp_path), verbose=0),
        ledger=ledger,
        dataset="synthetic",
        verbose=False,
    )
    with pytest.raises(Exception, match="refused before its first training step: .*sample_rate 0.0769231"):
        tuner.fit()
    assert not side.exists()  # no training step ran
    with open(tmp_path / "slip" / "privacy_report.json") as file:
        report = json.load(file)
    assert report["guarantee"]["epsilon"] == 0.0 and "refused before any training step" in report["guarantee"]["reason"]
    attempts = [attempt for trial in report["trials"].values() for attempt in trial["attempts"]]
    assert attempts and all(attempt["untrained"] for attempt in attempts)
    assert ledger.dataset_epsilon("synthetic", delta=DELTA) == 0.0


def test_a_tuning_trial_whose_loader_is_not_the_sample_s_is_refused_before_its_first_step():
    """Trained on all the data, it would be amplified as a run on the sample: refused, nothing spent."""
    from ray_dptune.tuning_sample import TuningSample

    sample = TuningSample.draw(0.3)
    sample.keep()
    config = {SAMPLE_KEY: sample.to_config()}
    engine, model, optimizer, loader = make_private()  # a plain DataLoader over all the data
    with pytest.raises(RefusedBeforeTraining, match="tuning_loader"):
        OpacusSpend(engine, optimizer, loader, steps=len(loader), config=config)
    data = TensorDataset(torch.randn(N, FEATURES), torch.randint(0, 2, (N,)))
    model = nn.Linear(FEATURES, 2)
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        data_loader=tuning_loader(data, config, batch_size=BATCH),
        noise_multiplier=1.3,
        max_grad_norm=1.0,
    )
    spend = OpacusSpend(engine, optimizer, loader, steps=len(loader), config=config)
    assert (
        spend.plan.sample_rate
        == opacus_plan(dataset_size=N, batch_size=BATCH, epochs=1).on_sample(0.3)(1.3).sample_rate
    )
