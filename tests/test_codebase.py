"""The codebase's own rules, checked on its source: no import circle, no private name used across
modules, keyword-only privacy arguments, and a size smell."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import ray_dptune

PACKAGE = Path(ray_dptune.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_LINES = 600
"""A smell, not the rule: modules are split by job, and a module of one job rarely needs more."""
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
    assert lines <= MAX_LINES, f"{_name(path)} has {lines} lines: does it do more than one job?"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The package's modules a module imports, at its top or inside a function (a late import is still an edge)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return found & modules


def _import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_circle():
    names = {path: _module_name(path) for path in MODULES}
    graph = {}
    for path, name in names.items():
        # a package's own parents are imported before it: no edge back to them
        imports = _imports(_tree(path), set(names.values()))
        graph[name] = {module for module in imports if module != name and not name.startswith(module + ".")}
    assert _import_cycles(graph) == []


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


def _exported_but_not_owned(tree: ast.Module) -> list[str]:
    """Names in a module's ``__all__`` that it imports instead of defining (a package's ``__init__`` may)."""
    defined, exported = set(), []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    defined.add(target.id)
                    if target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                        exported = [element.value for element in node.value.elts if isinstance(element, ast.Constant)]
    return [name for name in exported if name not in defined]


@pytest.mark.parametrize("path", [path for path in MODULES if path.name != "__init__.py"], ids=_name)
def test_a_module_exports_only_what_it_owns(path):
    assert _exported_but_not_owned(_tree(path)) == []


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
    reexport = ast.parse("from ray_dptune.search.space import is_fixed\nX = 1\n__all__ = ['X', 'is_fixed']\n")
    assert _exported_but_not_owned(reexport) == ["is_fixed"]
    circle = {"ray_dptune.a": {"ray_dptune.b"}, "ray_dptune.b": {"ray_dptune.a"}, "ray_dptune.c": {"ray_dptune.a"}}
    assert _import_cycles(circle) == [["ray_dptune.a", "ray_dptune.b"]]
    late = ast.parse(
        "import ray\nfrom ray_dptune.records import ledger\ndef f():\n    from ray_dptune.tune import guard\n"
    )
    modules = {"ray_dptune.records", "ray_dptune.records.ledger", "ray_dptune.tune.guard", "ray_dptune.tune"}
    assert _imports(late, modules) == {"ray_dptune.records.ledger", "ray_dptune.tune.guard"}


REFERENCE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):`~?(ray_dptune(?:\.\w+)+)`")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the package or an attribute reached from one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_every_cross_reference_in_a_docstring_resolves():
    references = {match for path in MODULES for match in REFERENCE.findall(path.read_text(encoding="utf-8"))}
    assert len(references) > 50  # the scan sees them
    assert sorted(reference for reference in references if not _resolves(reference)) == []


def test_the_noise_key_is_the_privacy_parameter_of_the_same_name():
    from ray_dptune.result_keys import NOISE_KEY
    from ray_dptune.training.plan import PRIVACY_KEYS

    assert NOISE_KEY in PRIVACY_KEYS
