"""The pure parts import without Ray or torch (fast to load, usable anywhere)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module", ["ray_dptune", "ray_dptune.accounting", "ray_dptune.accounting.account", "ray_dptune.search.projection"]
)
def test_pure_modules_pull_no_ray_and_no_torch(module):
    code = f"import sys, {module}; print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"
