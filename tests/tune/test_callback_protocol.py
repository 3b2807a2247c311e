"""The accountant's searcher protocol: trials a searcher's own bound covers, release guarantees, reports."""

from types import SimpleNamespace

import numpy as np
import pytest

from ray_dptune import PrivacyAccountantCallback, PrivacyError, TrialSpend
from ray_dptune.accounting import RDPCurve
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.records.ledger import PrivacyLedger
from ray_dptune.search.base import PrivateSearcher

PLAN = TrialSpend(sample_rate=0.05, noise_multiplier=1.5, steps=40)
ROUNDS = RDPCurve.pure(epsilon=0.1) * 5


class _ScreenThenTrain(PrivateSearcher):
    """Unaccounted screening trials, then one accounted final trial: curve = 5 pure-ε rounds + plan."""

    threat_model = "training set (test searcher)"
    coverage = "the final trial (test searcher)"

    def __init__(self):
        super().__init__(metric="acc", mode="max")
        self._num_trials, self._seed = 3, 0

    def accounts_trial(self, config):
        return config.get("final", False)

    def privacy_mechanism(self):
        return SearchMechanism.constant_overhead(epsilon_round=0.1, max_rounds=5)

    def privacy_details(self):
        return {"released_trial_id": "final", "rounds": 5}


class _SelfReleasing(PrivateSearcher):
    threat_model = "validation set (test searcher)"
    coverage = "the searcher's release (test searcher)"

    def __init__(self, delta=1e-6):
        super().__init__(metric="acc", mode="max")
        self._num_trials, self._seed, self._delta = 2, 0, delta

    def accounts_trial(self, config):
        return False

    def privacy_mechanism(self):
        return SearchMechanism.release(epsilon=2.0, delta=self._delta, description={"assumption": "test"})


def _trial(trial_id, **config):
    return SimpleNamespace(trial_id=trial_id, config=config)


def test_screening_trials_need_no_plan_and_their_failures_are_covered_by_the_searcher():
    accountant = PrivacyAccountantCallback(_ScreenThenTrain(), delta=1e-5, verbose=False)
    accountant.setup(num_samples=-1)
    screen = _trial("screen")
    accountant.on_trial_start(0, [], screen)
    accountant.on_trial_error(0, [], screen)  # failed screening attempt: no plan charged
    accountant.on_trial_start(0, [], screen)
    accountant.on_trial_result(0, [], screen, {"acc": 0.5})  # no dp_plan: accepted
    accountant.on_trial_complete(0, [], screen)  # no plan reached: not an early stop
    accountant.on_step_begin(0, [])
    assert accountant.guarantee()["epsilon"] is None  # the final trial has not reported its plan yet
    final = _trial("final", final=True)
    accountant.on_trial_start(0, [], final)
    with pytest.raises(PrivacyError, match="valid 'dp_plan'"):
        accountant.on_trial_result(0, [], final, {"acc": 0.9})
    accountant.on_trial_result(0, [], final, {"acc": 0.9, "dp_plan": PLAN.to_dict(), "dp_spent": PLAN.to_dict()})
    accountant.on_trial_complete(0, [], final)
    guarantee = accountant.guarantee()
    assert guarantee["charged_attempts"] == 0
    assert guarantee["epsilon"] == pytest.approx((ROUNDS + PLAN.curve()).epsilon(delta=1e-5), rel=1e-12)
    report = accountant.report().to_dict()
    assert report["unaccounted_trials"] == ["screen"]
    assert report["threat_model"] == _ScreenThenTrain.threat_model
    assert report["covers"] == _ScreenThenTrain.coverage
    assert report["details"] == {"released_trial_id": "final", "rounds": 5}
    assert report["law"] is None and report["density_ratio"] is None


def test_a_failed_accounted_attempt_is_charged_its_plan_on_top_of_the_searchers_curve():
    accountant = PrivacyAccountantCallback(_ScreenThenTrain(), delta=1e-5, plan=PLAN, verbose=False)
    final = _trial("final", final=True)
    accountant.on_trial_start(0, [], final)
    accountant.on_trial_error(0, [], final)
    accountant.on_trial_start(0, [], final)
    curve = np.array(accountant.guarantee()["curve"]["epsilons"], dtype=float)
    np.testing.assert_allclose(curve, (ROUNDS + PLAN.curve() + PLAN.curve()).epsilons, rtol=1e-12)


def test_a_release_guarantee_is_reported_as_the_searcher_states_it():
    accountant = PrivacyAccountantCallback(_SelfReleasing(), delta=1e-5, target_epsilon=2.5, verbose=False)
    accountant.setup(num_samples=-1)
    trial = _trial("t")
    accountant.on_trial_start(0, [], trial)
    accountant.on_trial_result(0, [], trial, {"acc": 0.7})
    accountant.on_trial_complete(0, [], trial)
    guarantee = accountant.guarantee()
    assert (guarantee["epsilon"], guarantee["delta"], guarantee["assumption"]) == (2.0, 1e-6, "test")


def test_a_release_guarantee_above_the_target_or_the_callbacks_delta_is_refused():
    with pytest.raises(PrivacyError, match="above target_epsilon"):
        PrivacyAccountantCallback(_SelfReleasing(), delta=1e-5, target_epsilon=1.5, verbose=False)
    with pytest.raises(PrivacyError, match="releases at δ = 0.001, above this search's δ = 1e-05"):
        PrivacyAccountantCallback(_SelfReleasing(delta=1e-3), delta=1e-5, verbose=False)


def test_searchers_outside_the_protocol_are_refused_and_the_ledger_takes_every_mechanism(tmp_path):
    with pytest.raises(TypeError, match="ray_dptune DP searcher"):
        PrivacyAccountantCallback(SimpleNamespace(num_trials=3), delta=1e-5)
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    with pytest.raises(ValueError, match="ledger needs plan="):
        PrivacyAccountantCallback(_ScreenThenTrain(), delta=1e-5, ledger=ledger, dataset="d")
    screened = PrivacyAccountantCallback(_ScreenThenTrain(), delta=1e-5, plan=PLAN, ledger=ledger, dataset="d")
    released = PrivacyAccountantCallback(_SelfReleasing(), delta=1e-5, ledger=ledger, dataset="d")
    for accountant in (screened, released):
        accountant.setup(num_samples=-1)
    final = _trial("final", final=True)
    screened.on_trial_start(0, [], final)
    screened.on_trial_error(0, [], final)  # the final run failed, no retry: one run with output "failed", covered
    assert screened.account.charged_attempts(if_stopped_now=True) == 0
    screened.on_trial_start(0, [], final)  # re-run anyway (Tuner.restore(resume_errored=True)): the failure is charged
    screened.on_trial_recover(0, [], final)  # failed again, and Tune retries it: charged before the retry starts
    screened.on_trial_start(0, [], final)
    screened.on_trial_error(0, [], final)  # the last attempt is covered
    assert screened.account.charged_attempts(if_stopped_now=True) == 2
    curve = ROUNDS + PLAN.curve() + PLAN.curve() + PLAN.curve()
    expected = curve.epsilon(delta=1e-5 - 1e-6) + 2.0  # basic composition with the (2, 1e-6) release
    assert ledger.dataset_epsilon("d", delta=1e-5) == pytest.approx(expected, rel=1e-9)


def test_the_report_withholds_configurations_an_adaptive_searcher_chose_from_unreleased_results():
    class _Adaptive(_SelfReleasing):
        configs_public = False

    for searcher, shown in ((_ScreenThenTrain(), {"lr": 0.5}), (_Adaptive(), None)):
        accountant = PrivacyAccountantCallback(searcher, delta=1e-5, verbose=False)
        accountant.on_trial_start(0, [], _trial("t", lr=0.5))
        config = accountant.report().trials["t"]["config"]
        assert config == shown if shown else config.startswith("withheld")


def test_the_ledger_records_every_searcher_before_any_trial(tmp_path):
    from ray import tune

    from ray_dptune import ConstantOverheadSearcher, DPBOSearcher, DPHyPOSearcher, PointMass, RandomCountSearcher

    space = {"lr": tune.uniform(0.1, 1.0)}
    searchers = {
        "RandomCountSearcher": RandomCountSearcher(PointMass(3), space=space, seed=0),
        "DPHyPOSearcher": DPHyPOSearcher(PointMass(3), space=space, upper=2.0, lower=0.5, seed=0),
        "ConstantOverheadSearcher": ConstantOverheadSearcher(
            [{"lr": 0.1}, {"lr": 1.0}], partitions=2, epsilon_round=0.1, granularity=0.1, metric="acc", seed=0
        ),
        "DPBOSearcher": DPBOSearcher(4, epsilon=0.5, delta=1e-7),
    }
    ledger = PrivacyLedger(tmp_path / "ledger.db")
    expected = []
    for name, searcher in searchers.items():
        plan = None if name == "DPBOSearcher" else PLAN
        accountant = PrivacyAccountantCallback(
            searcher, delta=1e-5, plan=plan, ledger=ledger, dataset="d", verbose=False
        )
        accountant.setup(num_samples=-1)
        expected.append(accountant.account.guarantee(if_stopped_now=True))
    recorded = {search["summary"]["searcher"]: search for search in ledger.searches("d")}
    assert set(recorded) == set(searchers)
    assert {recorded[name]["summary"]["mechanism"]["kind"] for name in recorded} == {
        "random_count",
        "constant_overhead",
        "release",
    }
    curve = expected[0].curve + expected[1].curve + expected[2].curve
    release = expected[3]
    total = curve.epsilon(delta=1e-5 - release.release_delta) + release.release_epsilon
    assert ledger.dataset_epsilon("d", delta=1e-5) == pytest.approx(total, rel=1e-9)
