"""The codebase's own rules, checked on its source: small modules, no private name used across
modules, keyword-only privacy arguments."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ray_dptune

PACKAGE = Path(ray_dptune.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 420
"""A module of one job fits in about 400 lines."""
PRIVACY_ARGUMENTS = {
    "delta",
    "density_ratio",
    "epsilon",
    "epsilon_round",
    "noise_multiplier",
    "rho",
    "sample_rate",
    "steps",
    "target_epsilon",
}
"""Arguments whose swap would silently change a guarantee: keyword-only in every public callable."""


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_fits_one_job(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines; split it by job (≤ ~400)."


def _private_uses(tree: ast.Module) -> list[str]:
    """Private names taken from another module: ``from m import _x``, ``m._x`` on an imported module."""
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"from {node.module} import {alias.name}")
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_no_private_name_crosses_a_module(path):
    assert _private_uses(_tree(path)) == []


def _positional_privacy_arguments(tree: ast.Module) -> list[str]:
    """Public module-level functions and methods taking a privacy argument positionally."""
    found = []
    scopes = [(tree, "")]
    while scopes:
        scope, prefix = scopes.pop()
        for node in scope.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                scopes.append((node, f"{prefix}{node.name}."))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                positional = [arg.arg for arg in node.args.posonlyargs + node.args.args]
                found += [f"{prefix}{node.name}({arg})" for arg in positional if arg in PRIVACY_ARGUMENTS]
    return found


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_privacy_arguments_are_keyword_only(path):
    assert _positional_privacy_arguments(_tree(path)) == []


def test_the_rules_catch_what_they_forbid():
    source = ast.parse(
        "from ray_dptune.search import candidates\n"
        "from ray_dptune.search.candidates import _axes\n"
        "candidates._combos()\n"
        "class Curve:\n"
        "    def epsilon(self, delta): ...\n"
        "def calibrate(plan, epsilon, *, delta): ...\n"
        "def fine(plan, *, epsilon, delta):\n"
        "    def inner(epsilon): ...\n"
    )
    assert _private_uses(source) == ["from ray_dptune.search.candidates import _axes", "candidates._combos"]
    assert _positional_privacy_arguments(source) == ["calibrate(epsilon)", "Curve.epsilon(delta)"]
