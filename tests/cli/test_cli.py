"""Tests of the ``ray-dptune`` command line (fast; no Ray)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ray_dptune import TrialSpend
from ray_dptune.accounting import RDPCurve, gaussian_profile, repeat_and_select, subsampled_gaussian_profile
from ray_dptune.accounting.bookkeeping.account import SearchAccount
from ray_dptune.accounting.bookkeeping.calibrate import calibrate_noise_multiplier
from ray_dptune.accounting.bookkeeping.search_mechanism import SearchMechanism
from ray_dptune.accounting.bounds.distributions import (
    Geometric,
    Logarithmic,
    PointMass,
    Poisson,
    TruncatedNegativeBinomial,
)
from ray_dptune.cli.main import main

SIGMA = 5**0.5  # the Gaussian mechanism with σ = √5 is 0.1-zCDP
SIGMA_TEXT = "2.2360679775"
DELTA = 1e-6


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    """Runs ``ray-dptune plan ARGS --json`` in process and parses its output."""
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def rows_by_law(report: dict) -> dict[str, dict]:
    return {row["law"]: row for row in report["rows"]}


def test_gaussian_poisson_json_matches_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--gaussian", SIGMA_TEXT, "--delta", "1e-6", "--mean", "10", "--law", "poisson")
    row = rows_by_law(report)["poisson"]
    sigma = float(SIGMA_TEXT)

    expected = repeat_and_select(
        RDPCurve.gaussian(noise_multiplier=sigma), Poisson(10), base_delta=gaussian_profile(noise_multiplier=sigma)
    ).epsilon(delta=DELTA)
    assert row["epsilon"] == expected  # same inputs, same code path: bit for bit
    assert row["epsilon"] == pytest.approx(
        repeat_and_select(
            RDPCurve.gaussian(noise_multiplier=SIGMA), Poisson(10), base_delta=gaussian_profile(noise_multiplier=SIGMA)
        ).epsilon(delta=DELTA),
        rel=1e-9,
    )
    assert row["composition_runs"] == 10
    assert row["epsilon_composition"] == (10 * RDPCurve.gaussian(noise_multiplier=sigma)).epsilon(delta=DELTA)
    assert row["epsilon"] < row["epsilon_composition"]
    assert row["ratio"] == pytest.approx(row["epsilon"] / row["epsilon_composition"])
    assert row["mean"] == 10.0
    assert row["expected_quantile"] == pytest.approx(1 - (1 - math.exp(-10)) / 10, rel=1e-12)
    assert row["success_probability"] == pytest.approx(1 - math.exp(-10 * 0.01), rel=1e-12)
    assert row["epsilon_one_run"] == pytest.approx(
        RDPCurve.gaussian(noise_multiplier=sigma).epsilon(delta=DELTA), rel=1e-12
    )
    assert report["delta"] == DELTA
    assert report["base"]["mechanism"] == "gaussian"
    # The exact profile helps: the default reads it from the Gaussian base itself; RDP alone is looser.
    base = RDPCurve.gaussian(noise_multiplier=sigma)
    assert row["epsilon"] == pytest.approx(repeat_and_select(base, Poisson(10)).epsilon(delta=DELTA), rel=1e-12)
    rdp_only = RDPCurve(base.orders, base.epsilons)  # the same curve, its mechanism unknown
    assert row["epsilon"] < repeat_and_select(rdp_only, Poisson(10)).epsilon(delta=DELTA)


def test_default_laws_and_their_exact_means(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--zcdp", "0.1", "--mean", "10", "30")
    assert [row["law"] for row in report["rows"]] == ["poisson", "logarithmic", "tnb:0.5", "geometric"] * 2
    base = RDPCurve.zcdp(rho=0.1)
    for row in report["rows"]:
        requested = row["requested_mean"]
        law = {
            "poisson": Poisson(requested),
            "logarithmic": Logarithmic.from_mean(requested),
            "tnb:0.5": TruncatedNegativeBinomial.from_mean(0.5, requested),
            "geometric": Geometric.from_mean(requested),
        }[row["law"]]
        assert row["mean"] == law.mean <= requested
        assert row["epsilon"] == repeat_and_select(base, law).epsilon(delta=DELTA)
        assert row["epsilon_composition"] == (int(requested) * base).epsilon(delta=DELTA)
        assert row["expected_quantile"] == law.expected_quantile()
        assert row["success_probability"] == law.success_probability(0.01)
        assert row["epsilon"] < row["epsilon_composition"]


def test_success_p_and_composition_rounds_mean_up(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--zcdp", "0.1", "--mean", "7.5", "--law", "geometric", "--success-p", "0.05")
    row = rows_by_law(report)["geometric"]
    law = Geometric.from_mean(7.5)
    assert row["composition_runs"] == 8
    assert row["epsilon_composition"] == pytest.approx((8 * RDPCurve.zcdp(rho=0.1)).epsilon(delta=DELTA), rel=1e-12)
    assert row["success_probability"] == pytest.approx(law.success_probability(0.05), rel=1e-12)
    assert report["success_p"] == 0.05


def test_the_default_is_never_looser_than_the_closed_form(capsys: pytest.CaptureFixture[str]) -> None:
    plain = rows_by_law(run_json(capsys, "--zcdp", "0.1", "--law", "logarithmic", "--closed-form"))["logarithmic"]
    generic = rows_by_law(run_json(capsys, "--zcdp", "0.1", "--law", "logarithmic"))["logarithmic"]
    expected = repeat_and_select(RDPCurve.zcdp(rho=0.1), Logarithmic.from_mean(10), generic=True).epsilon(delta=DELTA)
    assert generic["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert generic["epsilon"] <= plain["epsilon"]


def test_dpsgd_with_and_without_exact_profile(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--dpsgd", "0.01", "1.0", "100", "--law", "poisson", "--law", "tnb:0.5"]
    plain = rows_by_law(run_json(capsys, *args))
    exact = rows_by_law(run_json(capsys, *args, "--exact-profile"))
    base = RDPCurve.subsampled_gaussian(sample_rate=0.01, noise_multiplier=1.0, steps=100)
    assert plain["poisson"]["epsilon"] == pytest.approx(
        repeat_and_select(base, Poisson(10)).epsilon(delta=DELTA), rel=1e-12
    )
    assert plain["tnb:0.5"]["epsilon"] == pytest.approx(
        repeat_and_select(base, TruncatedNegativeBinomial.from_mean(0.5, 10)).epsilon(delta=DELTA), rel=1e-12
    )
    profile = subsampled_gaussian_profile(sample_rate=0.01, noise_multiplier=1.0, steps=100)
    assert exact["poisson"]["epsilon"] == repeat_and_select(base, Poisson(10), base_delta=profile).epsilon(delta=DELTA)
    assert base.epsilon(delta=DELTA) <= exact["poisson"]["epsilon"] < plain["poisson"]["epsilon"]
    assert exact["tnb:0.5"]["epsilon"] == plain["tnb:0.5"]["epsilon"]


def test_poisson_below_one_run_on_average(capsys: pytest.CaptureFixture[str]) -> None:
    """Poisson with E[K] < 1 is valid: K = 0 (no run) is likely, and ε stays above 0."""
    row = rows_by_law(run_json(capsys, "--gaussian", SIGMA_TEXT, "--mean", "0.5", "--law", "poisson"))["poisson"]
    expected = repeat_and_select(
        RDPCurve.gaussian(noise_multiplier=SIGMA), Poisson(0.5), base_delta=gaussian_profile(noise_multiplier=SIGMA)
    )
    assert row["epsilon"] == pytest.approx(expected.epsilon(delta=DELTA), rel=1e-12)
    assert row["epsilon"] > 0


def test_point_law_is_composition(capsys: pytest.CaptureFixture[str]) -> None:
    row = rows_by_law(run_json(capsys, "--zcdp", "0.1", "--mean", "10", "--law", "point"))["point"]
    assert row["law_spec"] == {"law": "point_mass", "k": 10}
    assert row["epsilon"] == row["epsilon_composition"] == (10 * RDPCurve.zcdp(rho=0.1)).epsilon(delta=DELTA)


def test_table_has_header_and_a_row_per_law(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gaussian", SIGMA_TEXT, "--mean", "10", "100"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "Gaussian" in lines[0] and "1e-06" in lines[0]
    for law in ("poisson", "logarithmic", "tnb:0.5", "geometric"):
        assert sum(line.startswith(law + " ") for line in lines) == 2
    poisson_row = next(line for line in lines if line.startswith("poisson "))
    epsilon = repeat_and_select(
        RDPCurve.gaussian(noise_multiplier=SIGMA), Poisson(10), base_delta=gaussian_profile(noise_multiplier=SIGMA)
    ).epsilon(delta=DELTA)
    assert f"{epsilon:.4f}" in poisson_row
    assert f"{(10 * RDPCurve.gaussian(noise_multiplier=SIGMA)).epsilon(delta=DELTA):.4f}" in poisson_row
    assert "composition" in out


def test_repeated_law_is_listed_once(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "--zcdp", "0.1", "--law", "tnb:0.5", "--law", "TNB:.5", "--law", "poisson")
    assert [row["law"] for row in report["rows"]] == ["tnb:0.5", "poisson"]


@pytest.mark.slow
def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "f.png"
    assert main(["plan", "--zcdp", "0.1", "--law", "poisson", "--law", "logarithmic", "--plot", str(path)]) == 0
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
    assert str(path) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zcdp", "0.1", "--law", "nonsense"], "unknown law 'nonsense'"),
        (["--zcdp", "0.1", "--law", "tnb:-1"], "η must be > -1"),
        (["--zcdp", "0.1", "--law", "tnb"], "needs its shape"),
        (["--zcdp", "0.1", "--mean", "0.5", "--law", "logarithmic"], "has mean > 1"),
        (["--zcdp", "0.1", "--mean", "1", "--law", "tnb:0.5"], "has mean > 1"),
        (["--zcdp", "0.1", "--mean", "-3"], "argument --mean: must be > 0"),
        (["--zcdp", "0.1", "--delta", "2"], "argument --delta: must lie strictly between 0 and 1"),
        (["--zcdp", "0.1", "--success-p", "1.5"], "argument --success-p"),
        (["--gaussian", "abc"], "argument --gaussian: expected a number"),
        (["--gaussian", "inf"], "expected a finite number"),
        (["--zcdp", "0"], "argument --zcdp: must be > 0"),
        (["--dpsgd", "2", "1", "10"], "SAMPLE_RATE must lie in (0, 1]"),
        (["--dpsgd", "0.1", "1", "1.5"], "STEPS must be a whole number"),
        (["--zcdp", "0.1", "--exact-profile"], "--exact-profile only applies to --dpsgd"),
        (["--zcdp", "0.1", "--gaussian", "1"], "not allowed with"),
        ([], "one of the arguments --gaussian --dpsgd --zcdp is required"),
        (["--zcdp", "0.1", "--plot", "/no/such/folder/f.png"], "does not exist"),
        (["--zcdp", "0.1", "--plot", "f.notanimage"], "unknown image format"),
    ],
)
def test_invalid_input_is_a_usage_error(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ray-dptune plan: error:")


# ---------------------------------------------------------------------- calibrate
DIGITS_RATE, DIGITS_STEPS = 64 / 1437, 198  # dp_trainable on digits: batch 64 of 1437, 9 epochs of int(1437/64) = 22
DIGITS_RATE_ARGS = ["--sample-rate", repr(DIGITS_RATE), "--steps", str(DIGITS_STEPS)]
DIGITS_TRAINING_ARGS = ["--dataset-size", "1437", "--batch-size", "64", "--epochs", "9"]
EPSILON_DELTA_ARGS = ["--epsilon", "3", "--delta", "1e-5"]
TARGET_ARGS = [*EPSILON_DELTA_ARGS, "--mean", "8"]


def calibrate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    """Runs ``ray-dptune calibrate ARGS --json`` in process and parses its output."""
    assert main(["calibrate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def digits_plan(sigma: float) -> TrialSpend:
    return TrialSpend(sample_rate=DIGITS_RATE, noise_multiplier=sigma, steps=DIGITS_STEPS)


def search_account(sigma: float, law: object) -> SearchAccount:
    mechanism = SearchMechanism.random_count(law=law, num_trials=1)
    return SearchAccount(mechanism, delta=1e-5, plan=digits_plan(sigma).to_dict())


@pytest.mark.slow
def test_calibrate_sigma_is_the_library_s_and_meets_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    report = calibrate_json(capsys, *TARGET_ARGS, *DIGITS_RATE_ARGS)
    sigma = calibrate_noise_multiplier(digits_plan, epsilon=3.0, delta=1e-5, law=Poisson(8))
    assert report["noise_multiplier"] == sigma
    assert 3.0 * 0.99 <= report["epsilon_search"] <= 3.0
    assert report["epsilon_search"] == search_account(sigma, Poisson(8)).guarantee().epsilon
    assert report["epsilon_search_all_retries"] == report["epsilon_search"]  # --retries 0
    assert report["epsilon_trial"] == pytest.approx(digits_plan(sigma).curve().epsilon(delta=1e-5), rel=1e-12)
    assert report["epsilon_trial"] < report["epsilon_search"]
    one_run = calibrate_noise_multiplier(digits_plan, epsilon=3.0, delta=1e-5, law=PointMass(1))
    assert report["noise_multiplier_one_run"] == one_run < sigma  # tuning costs noise
    assert report["noise_ratio"] == pytest.approx(sigma / one_run, rel=1e-12)
    assert report["law"] == {"name": "poisson", "law": "poisson", "mean": 8.0}
    assert report["schedule"]["steps"] == DIGITS_STEPS and report["schedule"]["dataset_size"] is None
    assert (report["epsilon_target"], report["delta"], report["retries"]) == (3.0, 1e-5, 0)


@pytest.mark.slow
def test_calibrate_table_prints_the_exact_sigma(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", *TARGET_ARGS, *DIGITS_RATE_ARGS]) == 0
    out = capsys.readouterr().out
    cells = [re.split(r"\s{2,}", line) for line in out.splitlines()]
    values = {row[0]: row[1] for row in cells if len(row) == 2}
    sigma = calibrate_noise_multiplier(digits_plan, epsilon=3.0, delta=1e-5, law=Poisson(8))
    assert float(values["noise multiplier σ"]) == sigma  # printed in full: a rounded-down σ could overspend
    assert float(values["ε whole search, no retry used"]) == pytest.approx(
        search_account(sigma, Poisson(8)).guarantee().epsilon, abs=5e-5
    )
    one_run = calibrate_noise_multiplier(digits_plan, epsilon=3.0, delta=1e-5, law=PointMass(1))
    assert float(values["σ for one run, no tuning"]) == one_run
    assert "ε = 3, δ = 1e-05" in out and "K ~ poisson with E[K] = 8" in out and "0 retries reserved" in out


@pytest.mark.slow
def test_calibrate_retries_reserve_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    plain = calibrate_json(capsys, *TARGET_ARGS, *DIGITS_RATE_ARGS)
    report = calibrate_json(capsys, *TARGET_ARGS, *DIGITS_RATE_ARGS, "--retries", "2")
    sigma = calibrate_noise_multiplier(digits_plan, epsilon=3.0, delta=1e-5, law=Poisson(8), retries=2)
    assert report["noise_multiplier"] == sigma > plain["noise_multiplier"]
    account = search_account(sigma, Poisson(8))
    assert report["epsilon_search_all_retries"] == account.guarantee(extra_charges=2).epsilon
    assert 3.0 * 0.99 <= report["epsilon_search_all_retries"] <= 3.0
    assert report["epsilon_search"] == account.guarantee().epsilon < report["epsilon_search_all_retries"]
    assert report["noise_multiplier_one_run"] == plain["noise_multiplier_one_run"]  # one run: no tuning, no retry
    assert main(["calibrate", *TARGET_ARGS, *DIGITS_RATE_ARGS, "--retries", "2"]) == 0
    out = capsys.readouterr().out
    assert "2 retries reserved" in out and "ε whole search, 2 retries used" in out


@pytest.mark.slow
def test_calibrate_splits_a_subsampled_tuning_s_budget_as_private_tuner_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ray_dptune.training import digits_cnn, digits_data, dp_trainable

    report = calibrate_json(capsys, *TARGET_ARGS, *DIGITS_TRAINING_ARGS, "--tuning-fraction", "0.1")
    trainable = dp_trainable(digits_cnn, digits_data, batch_size=64, epochs=9)
    tuning = trainable.privacy_plan({"noise_multiplier": report["noise_multiplier_tuning"]}, dataset_size=144)
    assert (report["tuning_schedule"]["sample_rate"], report["tuning_schedule"]["steps"]) == (
        tuning.sample_rate,
        tuning.steps,
    )
    final = digits_plan(report["noise_multiplier_final"])
    whole = SearchMechanism.subsampled_tuning(law=Poisson(8), num_trials=1, sample_rate=0.1, final_plan=final)
    stated = SearchAccount(whole, delta=1e-5, plan=tuning.to_dict()).guarantee().epsilon
    assert stated == report["epsilon_search"] and 0.99 * 3.0 < stated <= 3.0
    assert report["noise_multiplier_final"] <= 1.1 * report["noise_multiplier_one_run"] * 1.001
    assert report["noise_multiplier_final"] < report["noise_multiplier_ordinary_search"]
    assert report["steps_per_search"] < 0.25 * report["steps_per_ordinary_search"]
    with pytest.raises(SystemExit):
        main(["calibrate", *TARGET_ARGS, *DIGITS_RATE_ARGS, "--tuning-fraction", "0.1"])
    assert "--dataset-size, --batch-size and --epochs" in capsys.readouterr().err


@pytest.mark.slow
def test_calibrate_training_form_is_dp_trainable_s_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    from ray_dptune.training.plan import PrivacyParams, trial_plan

    by_training = calibrate_json(capsys, *TARGET_ARGS, *DIGITS_TRAINING_ARGS, "--retries", "1")
    by_rate = calibrate_json(capsys, *TARGET_ARGS, *DIGITS_RATE_ARGS, "--retries", "1")
    plan = trial_plan(PrivacyParams(noise_multiplier=1.0, batch_size=64, epochs=9), 1437)
    assert (plan.sample_rate, plan.steps) == (DIGITS_RATE, DIGITS_STEPS)
    assert by_training["schedule"] == {
        "sample_rate": DIGITS_RATE,
        "steps": DIGITS_STEPS,
        "dataset_size": 1437,
        "batch_size": 64,
        "epochs": 9,
    }
    for key in ("noise_multiplier", "epsilon_search", "epsilon_search_all_retries", "noise_multiplier_one_run"):
        assert by_training[key] == by_rate[key]
    assert main(["calibrate", *TARGET_ARGS, *DIGITS_TRAINING_ARGS]) == 0
    assert "198 steps (9 epochs of batch 64 from 1437 examples)" in capsys.readouterr().out


@pytest.mark.slow
def test_calibrate_other_laws(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--epsilon", "2", "--delta", "1e-5", "--sample-rate", "0.01", "--steps", "500"]

    def plan_for(sigma: float) -> TrialSpend:
        return TrialSpend(sample_rate=0.01, noise_multiplier=sigma, steps=500)

    tnb = calibrate_json(capsys, *args, "--law", "tnb:0.5", "--mean", "10")
    law = TruncatedNegativeBinomial.from_mean(0.5, 10)
    assert tnb["noise_multiplier"] == calibrate_noise_multiplier(plan_for, epsilon=2.0, delta=1e-5, law=law)
    assert tnb["law"]["name"] == "tnb:0.5" and tnb["law"]["mean"] == law.mean
    assert tnb["epsilon_search"] <= 2.0
    point = calibrate_json(capsys, *args, "--law", "point", "--mean", "1")
    assert point["noise_multiplier"] == point["noise_multiplier_one_run"]  # K = 1: no tuning
    assert point["noise_ratio"] == 1.0
    assert point["epsilon_search"] == pytest.approx(point["epsilon_trial"], rel=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epsilon", "0", "--delta", "1e-5", *DIGITS_RATE_ARGS], "argument --epsilon: must be > 0"),
        (["--epsilon", "-1", "--delta", "1e-5", *DIGITS_RATE_ARGS], "argument --epsilon: must be > 0"),
        (["--epsilon", "3", "--delta", "0", *DIGITS_RATE_ARGS], "argument --delta: must lie strictly between 0 and 1"),
        (["--epsilon", "3", "--delta", "1", *DIGITS_RATE_ARGS], "argument --delta: must lie strictly between 0 and 1"),
        (["--delta", "1e-5", *DIGITS_RATE_ARGS], "the following arguments are required: --epsilon"),
        (EPSILON_DELTA_ARGS, "give one trial's DP-SGD plan: --sample-rate and --steps, or"),
        ([*EPSILON_DELTA_ARGS, "--sample-rate", "0.1"], "missing --steps"),
        ([*EPSILON_DELTA_ARGS, "--epochs", "3"], "missing --dataset-size and --batch-size"),
        ([*EPSILON_DELTA_ARGS, *DIGITS_RATE_ARGS, *DIGITS_TRAINING_ARGS], "not both"),
        ([*EPSILON_DELTA_ARGS, *DIGITS_RATE_ARGS, "--epochs", "3"], "not both"),
        ([*EPSILON_DELTA_ARGS, "--sample-rate", "1.5", "--steps", "10"], "argument --sample-rate"),
        ([*EPSILON_DELTA_ARGS, "--sample-rate", "0.1", "--steps", "2.5"], "must be a whole number"),
        ([*EPSILON_DELTA_ARGS, "--dataset-size", "10", "--batch-size", "64", "--epochs", "1"], "lie in [1, 10]"),
        ([*EPSILON_DELTA_ARGS, *DIGITS_RATE_ARGS, "--retries", "-1"], "argument --retries: must be >= 0"),
        ([*EPSILON_DELTA_ARGS, *DIGITS_RATE_ARGS, "--law", "nonsense"], "unknown law 'nonsense'"),
        ([*EPSILON_DELTA_ARGS, *DIGITS_RATE_ARGS, "--law", "point", "--mean", "2.5"], "whole number"),
        ([*EPSILON_DELTA_ARGS, *DIGITS_RATE_ARGS, "--law", "geometric", "--mean", "1"], "has mean > 1"),
    ],
)
def test_calibrate_invalid_input_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ray-dptune calibrate: error:")


def test_calibrate_unreachable_target_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--epsilon", "1e-3", "--delta", "1e-5", "--sample-rate", "1", "--steps", "1000", "--law", "point"]
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", *args, "--mean", "100"])
    assert exit_info.value.code == 1
    assert "No noise multiplier up to" in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--gaussian",
        "--dpsgd",
        "--zcdp",
        "--exact-profile",
        "--delta",
        "--law",
        "--mean",
        "--success-p",
        "--closed-form",
        "--json",
        "--plot",
    ):
        assert option in out


def test_calibrate_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--epsilon",
        "--delta",
        "--law",
        "--mean",
        "--retries",
        "--sample-rate",
        "--steps",
        "--dataset-size",
        "--batch-size",
        "--epochs",
        "--json",
    ):
        assert option in out


@pytest.mark.slow
def test_cli_module_does_not_import_ray_or_torch() -> None:
    code = "import sys, ray_dptune.cli.main; print(any(m.split('.')[0] in ('ray', 'torch') for m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def _console_script() -> str:
    local = Path(sys.executable).parent / "ray-dptune"
    if local.exists():
        return str(local)
    found = shutil.which("ray-dptune")
    if found is None:
        pytest.skip("the ray-dptune console script is not installed (pip install -e .)")
    return found


@pytest.mark.slow
def test_console_script_runs() -> None:
    result = subprocess.run(
        [_console_script(), "plan", "--zcdp", "0.1", "--mean", "10"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "poisson" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_python_dash_m_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ray_dptune.cli.main", "plan", "--zcdp", "0.1", "--law", "geometric", "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rows"][0]["law"] == "geometric"


@pytest.mark.slow
def test_console_script_usage_error_exit_status() -> None:
    result = subprocess.run(
        [_console_script(), "plan", "--zcdp", "0.1", "--law", "nonsense"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "unknown law" in result.stderr and "Traceback" not in result.stderr
