"""Cells of a Ray Tune search space: the discretisation DP-HyPO's density lives on.

DP-HyPO (Wang et al. 2023, arXiv:2306.05734v2, §3.2 and App. C.2) bounds the
ratio of the adaptive sampling density to the prior, and solves the projection
on a discretisation of the space. Here the discretisation is a **partition** of
the space into cells; each cell has

* a prior mass (its probability under Tune's own sampler), and
* one representative point, where the surrogate model scores the cell.

A draw picks a cell with the adaptive probabilities and then a point uniformly
(in transformed coordinates) inside it. Inside a cell the draw therefore has
the prior's conditional law, so the density ratio to the prior at every point
equals the cell's probability ratio: bounding it per cell bounds it everywhere.

Coordinates. Every bounded numeric Tune domain is one axis of the unit cube,
mapped so that a uniform u gives Tune's law: ``uniform`` linearly,
``loguniform`` in log, ``randint``/``lograndint``/``qrandint`` and quantized
floats through the same maps and rounding Ray's samplers use (``snap``). A
``choice`` or ``grid_search`` is a discrete axis whose values each have prior
probability 1/n (Tune's law for ``choice``; the law RandomCountSearcher uses for
``grid_search``). ``sample_from`` functions are resolved last, from the rest of
the configuration and the searcher's generator, as Tune does.

Partitions (``d`` = number of numeric axes, ``n_disc`` = discrete combinations):

* ``d == 0``: one cell per discrete combination (the cells are the points);
* ``d <= 2``: a regular grid, 50 cells per axis by default (the paper's 16×20 and
  50×50 settings, App. E), fewer when ``n_disc`` would push the total above 2 500;
* ``d >= 3``: a k-d partition of scrambled Sobol points: the unit cube is split
  recursively, through the widest side, halfway between the two median points,
  until every box holds exactly one point. Each Sobol point owns its box, the
  boxes tile the cube, and a box is sampled uniformly exactly (unlike a Voronoi
  cell). 2 048 points by default (a power of two keeps Sobol's balance).

Each discrete combination is crossed with every numeric cell.
"""

from __future__ import annotations

import copy
import itertools
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from ray.tune.search.sample import Categorical, Float, Function, Integer, LogUniform, Quantized, Uniform
from ray.tune.search.variant_generator import assign_value, parse_spec_vars

__all__ = ["DEFAULT_CELLS", "GRID_POINTS", "MAX_CELLS", "SearchCells", "build_cells"]

DEFAULT_CELLS = 2500  # budget of cells when the caller gives none (the paper's largest grid, 50×50)
GRID_POINTS = 50  # default cells per numeric axis of a grid (d <= 2)
MAX_CELLS = 100_000  # more cells than this makes each draw's check and the GP scoring slow


class _NumericAxis:
    """One bounded numeric Tune domain as a coordinate u in [0, 1) of the unit cube."""

    def __init__(self, path: tuple, domain: Float | Integer):
        sampler = domain.get_sampler()
        self.q = None
        if isinstance(sampler, Quantized):
            self.q = sampler.q
            sampler = sampler.get_sampler()
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


class _DiscreteAxis:
    """A ``choice`` or ``grid_search``: n values, each of prior probability 1/n."""

    def __init__(self, path: tuple, categories: list):
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
class SearchCells:
    """A partition of a Tune space into cells with prior masses and representative points.

    Cell ``i`` is discrete combination ``i // n_boxes`` crossed with numeric box
    ``i % n_boxes``.

    Attributes:
        space: the Tune search space.
        lower: (n_boxes, d) lower corners of the numeric boxes in the unit cube.
        width: (n_boxes, d) side lengths of the boxes.
        anchor: (n_boxes, d) the representative point of each box (inside it).
        prior: (n_cells,) prior probability of each cell (sums to 1 up to rounding).
        features: (n_cells, k) the surrogate's input for each cell's representative point.
    """

    space: dict
    lower: np.ndarray
    width: np.ndarray
    anchor: np.ndarray
    prior: np.ndarray
    features: np.ndarray

    @property
    def n_cells(self) -> int:
        """How many cells partition the space."""
        return int(self.prior.size)

    def sample(self, cell: int, rng: np.random.Generator) -> tuple[dict[str, Any], np.ndarray]:
        """A configuration drawn uniformly (in cube coordinates) inside ``cell``, and its features."""
        numeric, discrete, functions = _axes(self.space)
        combo, box = divmod(int(cell), self.lower.shape[0])
        u = self.lower[box] + self.width[box] * rng.random(self.lower.shape[1])
        upper = np.minimum(self.lower[box] + self.width[box], 1.0)
        u = np.minimum(u, np.nextafter(upper, 0.0))  # stay inside [lower, upper) ⊂ [0, 1)
        indices = _combos(discrete)[combo]
        config = copy.deepcopy(self.space)
        for axis, t in zip(numeric, u):
            assign_value(config, axis.path, axis.value(float(t)))
        for axis, index in zip(discrete, indices):
            value = axis.values[index]
            assign_value(config, axis.path, value.item() if isinstance(value, np.generic) else value)
        for path, domain in functions:
            value = domain.sample(config=config, random_state=rng)
            assign_value(config, path, value.item() if isinstance(value, np.generic) else value)
        return config, _features(numeric, discrete, u[None, :], indices[None, :])[0]

    def to_state(self) -> dict[str, np.ndarray]:
        """The arrays that, with the space, rebuild these cells exactly."""
        return {"lower": self.lower, "width": self.width, "anchor": self.anchor}

    @classmethod
    def from_state(cls, space: dict, state: dict[str, np.ndarray]) -> SearchCells:
        """Cells of ``space`` with the saved boxes (no random draw: restore is exact)."""
        return _assemble(space, *(np.asarray(state[k], dtype=float) for k in ("lower", "width", "anchor")))


def build_cells(space: dict, rng: np.random.Generator, budget: int | None = None) -> SearchCells:
    """Partitions ``space`` into cells (see the module docstring for the rules).

    Args:
        space: a Tune search space (nested dict of domains, grid searches and constants).
        rng: the generator that scrambles the Sobol points (unused for grids).
        budget: the most cells in total; None for the defaults (50 per numeric axis
            for d <= 2, capped at 2 500; 2 048 Sobol points for d >= 3).

    Raises:
        ValueError: an unbounded or unsupported domain, a budget below 1, or more
            than ``MAX_CELLS`` discrete combinations.
    """
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ValueError(f"candidates must be a positive int (the number of cells) or None, got {budget!r}.")
    numeric, discrete, _ = _axes(space)
    n_disc = math.prod(len(axis.values) for axis in discrete)
    if n_disc > MAX_CELLS:
        raise ValueError(f"The space has {n_disc} discrete combinations, above {MAX_CELLS}; coarsen it.")
    d, per_combo = len(numeric), max(1, (budget or DEFAULT_CELLS) // n_disc)
    if d == 0:
        lower, width = np.zeros((1, 0)), np.ones((1, 0))
        anchor = lower
    elif d <= 2:
        m = max(1, math.floor(per_combo ** (1.0 / d) + 1e-9))
        m = min(m, GRID_POINTS) if budget is None else m
        edges = np.arange(m) / m
        lower = np.array(list(itertools.product(edges, repeat=d)), dtype=float)
        width = np.full_like(lower, 1.0 / m)
        anchor = lower + 0.5 * width
    else:
        n = 2 ** int(math.log2(per_combo)) if budget is None else per_combo
        anchor = _sobol(d, n, rng)
        lower, width = _kd_boxes(anchor)
    return _assemble(space, lower, width, anchor)


# ---------------------------------------------------------------------------- helpers
def _grid_index(bound: float, q: float, round_fn: Any) -> float:
    """Ray's ``Quantized._grid_index``: the bound's index on the multiples of q, rounded inwards."""
    scaled = bound / q
    nearest = round(scaled)
    return float(nearest) if math.isclose(scaled, nearest) else float(round_fn(scaled))


def _axes(space: dict) -> tuple[list[_NumericAxis], list[_DiscreteAxis], list[tuple[tuple, Function]]]:
    if not isinstance(space, dict):
        raise TypeError(f"The search space must be a dict (Tune's param_space), got {type(space).__name__}.")
    _, domain_vars, grid_vars = parse_spec_vars(space)
    numeric, discrete, functions = [], [], []
    for path, domain in domain_vars:
        if isinstance(domain, Function):
            functions.append((path, domain))
        elif isinstance(domain, Categorical):
            discrete.append(_DiscreteAxis(path, domain.categories))
        elif isinstance(domain, (Float, Integer)):
            numeric.append(_NumericAxis(path, domain))
        else:
            raise ValueError(f"{'/'.join(map(str, path))}: unsupported Tune domain {type(domain).__name__}.")  # noqa: TRY004
    discrete += [_DiscreteAxis(path, grid.categories) for path, grid in grid_vars]
    return numeric, discrete, functions


def _combos(discrete: list[_DiscreteAxis]) -> np.ndarray:
    sizes = [len(axis.values) for axis in discrete]
    if not sizes:
        return np.zeros((1, 0), dtype=int)
    return np.array(list(itertools.product(*map(range, sizes))), dtype=int)


def _features(numeric: list, discrete: list, u: np.ndarray, combos: np.ndarray) -> np.ndarray:
    """Surrogate inputs in [0, 1]: snapped numeric coordinates, then the discrete encodings."""
    columns = [
        np.array([[axis.coordinate(axis.value(float(t)))] for t in u[:, j]]).reshape(-1, 1)
        for j, axis in enumerate(numeric)
    ]
    columns += [axis.encoding[combos[:, j]] for j, axis in enumerate(discrete)]
    return np.hstack(columns) if columns else np.zeros((u.shape[0], 0))


def _assemble(space: dict, lower: np.ndarray, width: np.ndarray, anchor: np.ndarray) -> SearchCells:
    numeric, discrete, _ = _axes(space)
    if lower.shape[1] != len(numeric):
        raise ValueError("The saved cells do not match this space's numeric axes.")
    combos = _combos(discrete)
    volume = np.prod(width, axis=1)
    prior = np.tile(volume / volume.sum(), len(combos)) / len(combos)
    box_features = _features(numeric, [], anchor, np.zeros((len(anchor), 0), dtype=int))
    combo_features = _features([], discrete, np.zeros((len(combos), 0)), combos)
    features = np.hstack([np.tile(box_features, (len(combos), 1)), np.repeat(combo_features, len(anchor), axis=0)])
    return SearchCells(space, lower, width, anchor, prior, features)


def _sobol(d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    from scipy.stats import qmc

    try:
        engine = qmc.Sobol(d, scramble=True, rng=rng)
    except TypeError:  # scipy < 1.15 names it seed
        engine = qmc.Sobol(d, scramble=True, seed=rng)
    return engine.random_base2(max(0, math.ceil(math.log2(n))))[:n]


def _kd_boxes(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boxes tiling [0, 1)^d, each holding exactly one of ``points`` (distinct in every coordinate)."""
    n, d = points.shape
    lower, upper = np.zeros((n, d)), np.ones((n, d))
    stack = [(np.arange(n), np.zeros(d), np.ones(d))]
    while stack:
        members, lo, hi = stack.pop()
        if members.size == 1:
            lower[members[0]], upper[members[0]] = lo, hi
            continue
        axis = int(np.argmax(hi - lo))
        ordered = members[np.argsort(points[members, axis], kind="stable")]
        half = ordered.size // 2
        cut = 0.5 * (points[ordered[half - 1], axis] + points[ordered[half], axis])
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[axis] = right_lo[axis] = cut
        stack += [(ordered[:half], lo, left_hi), (ordered[half:], right_lo, hi)]
    return lower, upper - lower
