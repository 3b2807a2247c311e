"""The one reading of a Ray Tune search space, on Ray's own parser (``parse_spec_vars``).

Every searcher, the plan and the trainable read a space here:

* :func:`sample_config` draws a configuration with Ray's samplers (``Domain.sample``)
  from the searcher's generator: uniform, loguniform, randint, choice and their
  quantized forms keep exactly the law Tune documents; a ``grid_search`` is drawn
  uniformly over its points; ``sample_from`` functions are resolved last, with the
  rest of the configuration, as Tune does.
* :func:`expand_candidates` lists a finite space (grid and choice values only).
* :func:`read_space` maps a space onto coordinates (:class:`SpaceAxes`): every
  bounded numeric domain is one axis of the unit cube, mapped so that a uniform u
  gives Tune's law (``uniform`` linearly, ``loguniform`` in log, integer and
  quantized domains through the maps and rounding Ray's samplers use); a ``choice``
  or ``grid_search`` is a discrete axis whose values each have prior probability
  1/n (Tune's law for ``choice``; the law :func:`sample_config` uses for
  ``grid_search``).
* :func:`is_fixed`, :func:`choices`, :func:`check_space` and :func:`space_fingerprint`
  answer the small questions.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.tune.search.sample import Categorical, Float, Function, Integer, LogUniform, Quantized, Uniform
from ray.tune.search.variant_generator import assign_value, parse_spec_vars

__all__ = [
    "FINITE_ONLY",
    "DiscreteAxis",
    "NumericAxis",
    "SpaceAxes",
    "check_space",
    "choices",
    "expand_candidates",
    "is_fixed",
    "read_space",
    "sample_config",
    "space_fingerprint",
]

FINITE_ONLY = (
    "A finite candidate set S is a list of config dicts, or a space whose tuned entries are all "
    "tune.grid_search([...]) or tune.choice([...]); {path} is {kind}."
)


def check_space(space: Any) -> None:
    """Raises TypeError for a space that is not a dict of Tune domains and constants."""
    if not isinstance(space, dict):
        raise TypeError(f"The search space must be a dict (Tune's param_space), got {type(space).__name__}.")
    parse_spec_vars(space)


def sample_config(space: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """One configuration drawn from ``space`` with ``rng`` (independent of any data)."""
    _, domain_vars, grid_vars = parse_spec_vars(space)
    config = copy.deepcopy(space)
    for path, grid in grid_vars:
        assign_value(config, path, grid.categories[int(rng.integers(len(grid.categories)))])
    functions = []
    for path, domain in domain_vars:
        if isinstance(domain, Function):
            functions.append((path, domain))
        else:
            assign_value(config, path, _plain(domain.sample(random_state=rng)))
    for path, domain in functions:
        assign_value(config, path, _plain(domain.sample(config=config, random_state=rng)))
    return config


def is_fixed(value: Any) -> bool:
    """True when ``value`` holds no Tune domain or grid search (Tune passes it to every trial as is)."""
    _, domain_vars, grid_vars = parse_spec_vars({"value": value})
    return not domain_vars and not grid_vars


def choices(value: Any) -> list[Any] | None:
    """The values of a ``tune.choice`` or ``tune.grid_search``; None for anything else."""
    _, domain_vars, grid_vars = parse_spec_vars({"value": value})
    variables = domain_vars + grid_vars
    if len(variables) == 1 and variables[0][0] == ("value",) and isinstance(variables[0][1], Categorical):
        return list(variables[0][1].categories)
    return None


def expand_candidates(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The finite set S of a Tune space: the cartesian product of its grid and choice values.

    Order is deterministic: the space's keys in insertion order (nested dicts depth first),
    the last key varying fastest, each key's values in the order given. Constant entries
    are kept in every candidate.

    Raises:
        ValueError: a continuous or function-valued entry (S must be finite).
    """
    if not isinstance(space, Mapping):
        raise TypeError(f"The search space must be a dict (Tune's param_space), got {type(space).__name__}.")
    space = dict(space)
    _, domain_vars, grid_vars = parse_spec_vars(space)
    axes = []
    for path, domain in domain_vars + grid_vars:
        if not isinstance(domain, Categorical):
            kind = f"a {type(domain).__name__} domain"
            raise ValueError(FINITE_ONLY.format(path="/".join(map(str, path)), kind=kind))  # noqa: TRY004
        axes.append((path, list(domain.categories)))
    rank = {path: index for index, path in enumerate(_paths(space))}
    axes.sort(key=lambda axis: rank[axis[0]])  # Ray lists grids apart and sorted: restore the space's order
    candidates = []
    for values in itertools.product(*(options for _, options in axes)):
        config = copy.deepcopy(space)
        for (path, _), value in zip(axes, values):
            assign_value(config, path, copy.deepcopy(value))
        candidates.append(config)
    return candidates


def space_fingerprint(space: Any) -> str:
    """A canonical text of a Tune space (domains with their bounds and samplers), for equality checks."""
    return json.dumps(_describe(space), sort_keys=True, default=repr)


# ---------------------------------------------------------------------------- coordinates
class NumericAxis:
    """One bounded numeric Tune domain as a coordinate u in [0, 1) of the unit cube."""

    def __init__(self, path: tuple[Any, ...], domain: Float | Integer):
        sampler = domain.get_sampler()  # type: ignore[no-untyped-call]  # Ray leaves get_sampler unannotated
        self.q: float | None = None
        if isinstance(sampler, Quantized):
            self.q = sampler.q
            sampler = sampler.get_sampler()  # type: ignore[no-untyped-call]  # Ray leaves get_sampler unannotated
        if not isinstance(sampler, (Uniform, LogUniform)):  # a bad value of a Tune space, as Tune says too
            raise ValueError(  # noqa: TRY004
                f"{'/'.join(map(str, path))}: a {type(domain).__name__} domain with sampler "
                f"{type(sampler).__name__} has no bounded uniform prior; DP-HyPO bounds the density "
                "relative to a prior on a finite space. Use tune.uniform / loguniform / randint / choice."
            )
        self.path, self.is_int, self.log = path, isinstance(domain, Integer), isinstance(sampler, LogUniform)
        lo, hi = float(domain.lower), float(domain.upper)
        if self.q is not None:  # Ray snaps the bounds inwards to multiples of q (sample.py::Quantized)
            lo, hi = _grid_index(lo, self.q, math.ceil), _grid_index(hi, self.q, math.floor)
            if self.is_int:
                hi += 0 if self.q == 1 else 1  # Ray's index domain is upper-exclusive except for q == 1
            else:
                lo, hi = lo * self.q, hi * self.q
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi) or (self.log and lo <= 0):
            raise ValueError(f"{'/'.join(map(str, path))}: bounds [{lo}, {hi}) do not make a finite prior.")
        self.lo, self.hi = lo, hi
        self._a, self._b = (math.log(lo), math.log(hi)) if self.log else (lo, hi)

    def value(self, u: float) -> float | int:
        """Tune's value for coordinate u: uniform u gives exactly Ray's law for this domain."""
        x = self._a + u * (self._b - self._a)
        x = math.exp(x) if self.log else x
        if self.is_int:  # Ray: integers(lo, hi) or floor(exp(uniform(log lo, log hi))), times q
            k = min(max(math.floor(x), int(self.lo)), math.ceil(self.hi) - 1)
            return int(k * self.q) if self.q is not None else int(k)
        return float(np.round(x / self.q) * self.q) if self.q is not None else float(x)

    def coordinate(self, value: float) -> float:
        """Where the surrogate sees ``value``: the (centre of its) preimage, in [0, 1]."""
        x = float(value)
        if self.is_int:  # the centre of the index's preimage [k, k + 1) in the sampler's scale
            x = x / self.q if self.q is not None else x
            x = math.sqrt(x * (x + 1.0)) if self.log else x + 0.5
        t = ((math.log(x) if self.log else x) - self._a) / (self._b - self._a)
        return min(max(t, 0.0), 1.0)


class DiscreteAxis:
    """A ``choice`` or ``grid_search``: n values, each of prior probability 1/n."""

    def __init__(self, path: tuple[Any, ...], categories: list[Any]):
        self.path, self.values = path, list(categories)
        numeric = all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in self.values)
        distinct = sorted({float(v) for v in self.values}) if numeric else []
        if len(distinct) > 1:  # ordered: one coordinate, the value's rank
            rank = {v: i / (len(distinct) - 1) for i, v in enumerate(distinct)}
            self.encoding = np.array([[rank[float(v)]] for v in self.values])
        else:  # unordered: one-hot over distinct values (no column for a single value)
            labels = list(dict.fromkeys(map(repr, self.values)))
            columns = len(labels) if len(labels) > 1 else 0
            self.encoding = np.zeros((len(self.values), columns))
            for row, v in enumerate(self.values):
                if columns:
                    self.encoding[row, labels.index(repr(v))] = 1.0


@dataclass(frozen=True)
class SpaceAxes:
    """A Tune space as coordinates: numeric axes, discrete axes and ``sample_from`` functions.

    A point is ``u`` (one coordinate in [0, 1) per numeric axis) with ``combo`` (one
    value index per discrete axis); the surrogate's features of a point lie in [0, 1].
    """

    space: dict[str, Any]
    numeric: tuple[NumericAxis, ...]
    discrete: tuple[DiscreteAxis, ...]
    functions: tuple[tuple[tuple[Any, ...], Function], ...]

    def combos(self) -> np.ndarray:
        """(n_disc, len(discrete)) every combination of discrete value indices, last axis fastest."""
        sizes = [len(axis.values) for axis in self.discrete]
        if not sizes:
            return np.zeros((1, 0), dtype=int)
        return np.array(list(itertools.product(*map(range, sizes))), dtype=int)

    def config(self, u: np.ndarray, combo: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        """The configuration at ``u``, ``combo``; ``sample_from`` functions resolved last, from ``rng``."""
        config = copy.deepcopy(self.space)
        for numeric, t in zip(self.numeric, u):
            assign_value(config, numeric.path, numeric.value(float(t)))
        for discrete, index in zip(self.discrete, combo):
            assign_value(config, discrete.path, _plain(discrete.values[index]))
        for path, domain in self.functions:
            assign_value(config, path, _plain(domain.sample(config=config, random_state=rng)))
        return config

    def numeric_features(self, u: np.ndarray) -> np.ndarray:
        """(n, len(numeric)): the snapped values' coordinates of the (n, len(numeric)) points ``u``."""
        if not self.numeric:
            return np.zeros((u.shape[0], 0))
        return np.array([[axis.coordinate(axis.value(float(t))) for axis, t in zip(self.numeric, row)] for row in u])

    def discrete_features(self, combos: np.ndarray) -> np.ndarray:
        """(n, k): the discrete axes' encodings of the (n, len(discrete)) index rows ``combos``."""
        columns = [axis.encoding[combos[:, j]] for j, axis in enumerate(self.discrete)]
        return np.hstack(columns) if columns else np.zeros((combos.shape[0], 0))

    def features(self, u: np.ndarray, combos: np.ndarray) -> np.ndarray:
        """Surrogate inputs in [0, 1]: the numeric coordinates, then the discrete encodings."""
        return np.hstack([self.numeric_features(u), self.discrete_features(combos)])


def read_space(space: dict[str, Any]) -> SpaceAxes:
    """The axes of ``space``, in the order of Ray's parser (grid searches last).

    Raises:
        TypeError: ``space`` is not a dict.
        ValueError: a numeric domain without a bounded uniform prior (e.g. ``tune.randn``).
    """
    check_space(space)
    _, domain_vars, grid_vars = parse_spec_vars(space)
    numeric: list[NumericAxis] = []
    discrete: list[DiscreteAxis] = []
    functions: list[tuple[tuple[Any, ...], Function]] = []
    for path, domain in domain_vars:
        if isinstance(domain, Function):
            functions.append((path, domain))
        elif isinstance(domain, Categorical):
            discrete.append(DiscreteAxis(path, domain.categories))
        elif isinstance(domain, (Float, Integer)):
            numeric.append(NumericAxis(path, domain))
        else:
            raise ValueError(f"{'/'.join(map(str, path))}: unsupported Tune domain {type(domain).__name__}.")  # noqa: TRY004
    discrete += [DiscreteAxis(path, grid.categories) for path, grid in grid_vars]
    return SpaceAxes(space, tuple(numeric), tuple(discrete), tuple(functions))


# ---------------------------------------------------------------------------- helpers
def _plain(value: Any) -> Any:
    """Numpy scalars as Python numbers, so configs serialise cleanly."""
    return value.item() if isinstance(value, np.generic) else value


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a nested space, depth first in the space's own order, named as Ray's parser names them."""
    items = node.items() if isinstance(node, Mapping) else enumerate(node)
    paths = []
    for key, value in items:
        paths.append((*prefix, key))
        if isinstance(value, (Mapping, list, tuple)):
            paths += _paths(value, (*prefix, key))
    return paths


def _grid_index(bound: float, q: float, round_fn: Any) -> float:
    """Ray's ``Quantized._grid_index``: the bound's index on the multiples of q, rounded inwards."""
    scaled = bound / q
    nearest = round(scaled)
    return float(nearest) if math.isclose(scaled, nearest) else float(round_fn(scaled))


def _describe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _describe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_describe(item) for item in value]
    if callable(value) and not hasattr(value, "__dict__"):
        return getattr(value, "__qualname__", repr(value))
    if hasattr(value, "__dict__") and not isinstance(value, type):
        fields = {key: _describe(item) for key, item in vars(value).items() if not key.startswith("__")}
        return (
            {"type": type(value).__name__, **fields}
            if not callable(value)
            else getattr(value, "__qualname__", repr(value))
        )
    return value
