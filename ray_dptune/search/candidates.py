"""Discretisations of a Ray Tune search space: DP-HyPO's cells and DP-BO's candidate set.

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

Coordinates are :func:`~ray_dptune.search.space.read_space`'s: a uniform u on a
numeric axis gives Tune's law for that domain, and each value of a ``choice`` or
``grid_search`` has prior probability 1/n.

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

DP-BO's candidate set Λ (:func:`build_candidate_set`) uses the same coordinates:
scrambled Sobol points crossed with the discrete combinations, drawn before any data.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ray_dptune.search.space import read_space

__all__ = [
    "DEFAULT_CELLS",
    "GRID_POINTS",
    "MAX_CANDIDATES",
    "MAX_CELLS",
    "SearchCells",
    "build_candidate_set",
    "build_cells",
    "sobol_points",
]

DEFAULT_CELLS = 2500  # budget of cells when the caller gives none (the paper's largest grid, 50×50)
GRID_POINTS = 50  # default cells per numeric axis of a grid (d <= 2)
MAX_CELLS = 100_000  # more cells than this makes each draw's check and the GP scoring slow
MAX_CANDIDATES = 20_000  # the most configurations in DP-BO's candidate set Λ


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

    space: dict[str, Any]
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
        axes = read_space(self.space)
        combo, box = divmod(int(cell), self.lower.shape[0])
        u = self.lower[box] + self.width[box] * rng.random(self.lower.shape[1])
        upper = np.minimum(self.lower[box] + self.width[box], 1.0)
        u = np.minimum(u, np.nextafter(upper, 0.0))  # stay inside [lower, upper) ⊂ [0, 1)
        indices = axes.combos()[combo]
        config = axes.config(u, indices, rng)
        return config, axes.features(u[None, :], indices[None, :])[0]

    def to_state(self) -> dict[str, np.ndarray]:
        """The arrays that, with the space, rebuild these cells exactly."""
        return {"lower": self.lower, "width": self.width, "anchor": self.anchor}

    @classmethod
    def from_state(cls, space: dict[str, Any], state: dict[str, np.ndarray]) -> SearchCells:
        """Cells of ``space`` with the saved boxes (no random draw: restore is exact)."""
        return _assemble(space, *(np.asarray(state[k], dtype=float) for k in ("lower", "width", "anchor")))


def build_cells(space: dict[str, Any], rng: np.random.Generator, budget: int | None = None) -> SearchCells:
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
    axes = read_space(space)
    n_disc = math.prod(len(axis.values) for axis in axes.discrete)
    if n_disc > MAX_CELLS:
        raise ValueError(f"The space has {n_disc} discrete combinations, above {MAX_CELLS}; coarsen it.")
    d, per_combo = len(axes.numeric), max(1, (budget or DEFAULT_CELLS) // n_disc)
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
        anchor = sobol_points(d, n, rng)
        lower, width = _kd_boxes(anchor)
    return _assemble(space, lower, width, anchor)


def build_candidate_set(
    space: dict[str, Any], rng: np.random.Generator, num_candidates: int
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """DP-BO's Λ of a Tune space: configurations and their unit-cube coordinates, drawn without data.

    grid_search and choice values form a cartesian product; the numeric domains get
    ``num_candidates`` scrambled Sobol points (from ``rng``) crossed with it;
    ``sample_from`` values are resolved once per candidate. Duplicates are dropped.

    Returns:
        (configs, features): n configurations and an (n, k) array in [0, 1].

    Raises:
        ValueError: an empty Λ, an unbounded domain, or more than ``MAX_CANDIDATES``.
    """
    axes = read_space(space)
    combos = axes.combos()
    if combos.shape[0] == 0 or any(len(axis.values) == 0 for axis in axes.discrete):
        raise ValueError("The search space has an empty grid_search or choice: the candidate set Λ is empty.")
    u = sobol_points(len(axes.numeric), num_candidates, rng) if axes.numeric else np.zeros((1, 0))
    if combos.shape[0] * u.shape[0] > MAX_CANDIDATES:
        raise ValueError(f"Λ would hold {combos.shape[0] * u.shape[0]} candidates, above {MAX_CANDIDATES}; coarsen it.")
    configs, rows, seen = [], [], set()
    for combo in combos:
        features = axes.features(u, np.tile(combo, (u.shape[0], 1)))
        for point, row in zip(u, features):
            config = axes.config(point, combo, rng)
            key = json.dumps(config, sort_keys=True, default=repr)
            if key not in seen:
                seen.add(key)
                configs.append(config)
                rows.append(row)
    return configs, np.asarray(rows, dtype=float).reshape(len(configs), -1)


# ---------------------------------------------------------------------------- helpers
def _assemble(space: dict[str, Any], lower: np.ndarray, width: np.ndarray, anchor: np.ndarray) -> SearchCells:
    axes = read_space(space)
    if lower.shape[1] != len(axes.numeric):
        raise ValueError("The saved cells do not match this space's numeric axes.")
    combos = axes.combos()
    volume = np.prod(width, axis=1)
    prior = np.tile(volume / volume.sum(), len(combos)) / len(combos)
    box_features, combo_features = axes.numeric_features(anchor), axes.discrete_features(combos)
    features = np.hstack([np.tile(box_features, (len(combos), 1)), np.repeat(combo_features, len(anchor), axis=0)])
    return SearchCells(space, lower, width, anchor, prior, features)


def sobol_points(d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, d) scrambled Sobol points in [0, 1)^d (the first n of the next power of two), from ``rng``."""
    from scipy.stats import qmc

    try:
        engine = qmc.Sobol(d, scramble=True, rng=rng)
    except TypeError:  # scipy < 1.15 names it seed
        engine = qmc.Sobol(d, scramble=True, seed=rng)
    points: np.ndarray = engine.random_base2(max(0, math.ceil(math.log2(n))))[:n]
    return points


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
