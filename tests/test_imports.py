"""What each install can import.

The pure parts import without Ray or torch (fast to load, usable anywhere). The core install
(``pip install ray_dptune``: numpy, SciPy, dp-accounting, Ray Tune) imports everything but
training/ and the GP searchers, and runs every ``ray-dptune`` command; a module that needs an
extra says which (ray_dptune/extras.py). Here a subprocess blocks the optional packages with a
meta-path finder; scripts/check_core_install.sh does the same in a real clean venv.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ray_dptune"

BLOCKED = ("torch", "opacus", "botorch", "gpytorch", "linear_operator", "matplotlib", "sklearn")
"""The optional packages (and linear_operator, which only GPyTorch brings)."""

NEEDS_EXTRA = {"ray_dptune.training": "train", "ray_dptune.search.dphypo": "dphypo", "ray_dptune.search.dpbo": "dphypo"}
"""Modules (and their submodules) that the core install refuses, with the extra each names."""

BLOCKER = f"""
import importlib.abc, sys

class BlockOptional(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by tests/test_imports.py)", name=name)
        return None

sys.meta_path.insert(0, BlockOptional())
"""

CORE_SCRIPT = """
import contextlib, importlib, io, json, runpy, sys, tempfile
from pathlib import Path

package = Path(sys.argv[1])
modules = sorted(
    ".".join(("ray_dptune", *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
    for p in package.rglob("*.py")
)
imports = {}
for name in modules:
    try:
        importlib.import_module(name)
        imports[name] = None
    except ImportError as error:
        imports[name] = [type(error).__name__, str(error), type(error.__cause__).__name__]

from ray_dptune import Poisson, RDPCurve, TrialSpend, calibrate_noise_multiplier, repeat_and_select

base = RDPCurve.subsampled_gaussian(sample_rate=0.045, noise_multiplier=2.49, steps=336)
epsilon = repeat_and_select(base, Poisson(mean=8)).epsilon(delta=1e-5)
sigma = calibrate_noise_multiplier(
    lambda s: TrialSpend(sample_rate=0.045, noise_multiplier=s, steps=336), epsilon=3.0, delta=1e-5, law=Poisson(mean=8)
)


def command(*argv):
    sys.argv = ["ray-dptune", *argv]
    sys.modules.pop("ray_dptune.cli.main", None)  # as `python -m` runs it: fresh, not the copy imported above
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("ray_dptune.cli.main", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit:
            code = exit.code
    return [code, out.getvalue(), err.getvalue()]


folder = Path(tempfile.mkdtemp())
from ray_dptune.records.ledger import PrivacyLedger

PrivacyLedger(folder / "ledger.db").close()
commands = {
    "plan": command("plan", "--dpsgd", "0.045", "2.49", "336", "--delta", "1e-5", "--mean", "8"),
    "plan --plot": command("plan", "--zcdp", "0.1", "--delta", "1e-6", "--mean", "10", "--plot", str(folder / "p.png")),
    "calibrate": command(
        "calibrate", "--epsilon", "3", "--delta", "1e-5", "--mean", "8",
        "--dataset-size", "1437", "--batch-size", "64", "--epochs", "9",
    ),
    "ledger": command("ledger", "show", str(folder / "ledger.db")),
    "journal": command("journal", str(folder)),
}
blocked = sorted(m for m in sys.modules if m.partition(".")[0] in {blocked!r})
print(json.dumps({"imports": imports, "epsilon": epsilon, "sigma": sigma, "commands": commands, "blocked": blocked}))
"""


def _needs(module: str) -> str | None:
    return next((extra for top, extra in NEEDS_EXTRA.items() if module == top or module.startswith(top + ".")), None)


@pytest.mark.parametrize(
    "module",
    [
        "ray_dptune",
        "ray_dptune.accounting",
        "ray_dptune.accounting.bookkeeping.account",
        "ray_dptune.search.projection",
    ],
)
def test_pure_modules_pull_no_ray_and_no_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


@pytest.fixture(scope="module")
def core():
    """One subprocess without the optional packages: every module imported, the API and each command run."""
    script = BLOCKER + CORE_SCRIPT.replace("{blocked!r}", repr(BLOCKED))
    run = subprocess.run(
        [sys.executable, "-c", script, str(PACKAGE)], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_core_imports_everything_but_the_extras(core):
    """Each module imports, or (training/, the GP searchers) raises the ImportError naming its extra."""
    assert len(core["imports"]) > 50
    for module, error in core["imports"].items():
        extra = _needs(module)
        if extra is None:
            assert error is None, f"{module} needs an optional package in the core install: {error}"
        else:
            assert error is not None, f"{module} imported without {extra}'s packages"
            kind, message, cause = error
            assert kind == "MissingExtraError" and cause in ("ModuleNotFoundError", "MissingExtraError"), error
            assert message.endswith(f": pip install 'ray_dptune[{extra}]'"), message
    assert core["blocked"] == []


def test_training_names_the_train_extra(core):
    """The message of the issue, chained from the missing module's own error."""
    _, message, cause = core["imports"]["ray_dptune.training"]
    assert message == "ray_dptune.training needs torch and Opacus: pip install 'ray_dptune[train]'"
    assert cause == "ModuleNotFoundError"
    assert core["imports"]["ray_dptune.search.dphypo"][1] == (
        "ray_dptune.search.dphypo needs BoTorch and GPyTorch: pip install 'ray_dptune[dphypo]'"
    )


def test_core_accounting_api_computes(core):
    """The README's accounting example and a calibration, in the core install (numbers: tests/accounting/test_selection.py)."""
    assert 0 < core["epsilon"] < 10
    assert 0 < core["sigma"] < 10


@pytest.mark.parametrize("name", ["plan", "calibrate", "ledger"])
def test_core_commands_run(core, name):
    code, out, err = core["commands"][name]
    assert code == 0, err
    assert out.strip()
    if name == "plan":
        assert "poisson" in out.lower() and "composition" in out.lower()


def test_core_journal_command_answers_with_the_librarys_message(core):
    code, _, err = core["commands"]["journal"]
    assert code == 1 and "Traceback" not in err and err.startswith("ray-dptune journal: error:"), err


def test_core_plot_names_the_plot_extra(core):
    code, _, err = core["commands"]["plan --plot"]
    assert code == 2 and "Traceback" not in err
    assert "ray-dptune plan --plot needs matplotlib: pip install 'ray_dptune[plot]'" in err


def test_digits_data_names_the_examples_extra():
    """training/ with torch and Opacus but without scikit-learn: digits_data names ``[examples]``."""
    pytest.importorskip("opacus")
    script = BLOCKER.replace(repr(BLOCKED), repr(("sklearn",))) + (
        "from ray_dptune.training import digits_data\n"
        "try:\n    digits_data()\nexcept ImportError as error:\n    print(error)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    assert (
        run.stdout.strip() == "ray_dptune.training.digits_data needs scikit-learn: pip install 'ray_dptune[examples]'"
    )


@pytest.mark.parametrize(
    ("dataset_size", "batch_size"), [(1437, 64), (60000, 256), (10, 10), (10, 1), (1000, 3), (999, 333)]
)
def test_core_schedule_is_opacus_schedule(dataset_size, batch_size):
    """accounting.spend.sampling_schedule (no torch) yields as many steps as Opacus's sampler (oracle: Opacus)."""
    uniform_sampler = pytest.importorskip("opacus.utils.uniform_sampler")
    from ray_dptune.accounting.bookkeeping.spend import sampling_schedule

    sample_rate, steps = sampling_schedule(dataset_size, batch_size)
    sampler = uniform_sampler.UniformWithReplacementSampler(num_samples=dataset_size, sample_rate=sample_rate)
    assert (sample_rate, steps) == (batch_size / dataset_size, len(sampler))
