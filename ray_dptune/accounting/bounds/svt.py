"""Sparse-vector rounds of constant-overhead DP tuning (Ding et al. 2023, Algorithm 1): pure math.

Ding, Wu, Xu & Pan, "Constant-overhead Differentially Private Hyperparameter Tuning"
(the text in ``shared/papers/constant-overhead-dp-tuning_ding-et-al.txt``). After
|S|·k trainings on k disjoint partitions of the training set, candidate s has the
utility u_s = mean of its k validation accuracies, each in [0, 1]; by **Lemma 2** a
neighbouring training set changes every u_s by at most Δ = 1/k (only one partition
differs). Algorithm 1, lines 12–34, then climbs a utility level u = u0 + g·level with
an elastic step (doubling on a pass, halving on a fail) until the step reaches 0:

* line 16: threshold û = u + step·g + Lap(2/(kε)) (= Lap(2Δ/ε));
* lines 19–29: the first candidate s (in order) with u_s + Lap(4/(kε)) ≥ û passes:
  s* ← s, u ← u + g·step, step ← 2·step;
* lines 30–33: if none passes, step ← ⌊step/2⌋.

Privacy of one round. A round is AboveThreshold (Dwork & Roth 2014, Algorithm 1,
**Theorem 3.23**: threshold noise Lap(2Δ/ε), query noise Lap(4Δ/ε), halt at the first
query above the threshold) over the queries u_1, ..., u_|S| with sensitivity Δ = 1/k,
so it is ε-DP; its other possible output, "no candidate passed", is covered by the same
proof (shift the threshold noise by Δ: cost ε/2; Lyu, Su & Li 2017, "Understanding the
Sparse Vector Technique", PVLDB 10(6), Theorem 2 with c = 1). Ding et al., **Theorem 3**,
part I, proves the same per round. The state (level, step, s*) after a round is a
function of the rounds' outputs, so rounds compose adaptively.

Number of rounds. Theorem 3, part II, bounds the number of rounds only with high
probability (Theorem 2), which costs an extra δ' = O(n^{-gkε/4} log n) that the paper
leaves as an O(·). Here the loop is **capped** at ``max_rounds`` = T_max and T_max is
fixed before any data is seen; once the loop has stopped, the remaining rounds output
nothing (they are 0-DP). The whole selection is therefore T_max-fold adaptive
composition of ε-DP rounds, with no δ': in RDP, T_max · min(ε, αε²/2) (Mironov 2017,
Prop. 1; Bun & Steinke 2016, Prop. 3.3), see :func:`svt_curve`. When the cap stops the
loop early, the current s* is used (post-processing).

Default T_max. In the non-randomised world (Definition 5: all noise zero) a round
passes iff level + step ≤ L*, where L* is the largest level with u0 + g·L* ≤ max u_s;
:func:`noiseless_rounds` counts the rounds exactly (Lemma 1's proof, corrected by one:
halving the step from 2^j to 0 takes j + 1 rounds, so the count is 2m + 2j + 1, not the
proof's 2m + 2j). Utilities are accuracies, so L* ≤ n = ⌈(1 − u0)/g⌉ whatever the data,
and :func:`worst_case_noiseless_rounds` is the maximum over L* ∈ {0, ..., n} (about
4·log2(n) + 1). :func:`default_max_rounds` doubles it: noise makes a run take extra
rounds (the paper's Fig. 4 measures T ≈ 3·log n); with the doubled cap the loop ends
on the same s* as the uncapped algorithm in ≥ 97% of simulated runs when kε ≥ 5
(see the function for the measurements).

>>> from ray_dptune.accounting.bounds.svt import SVTParams, default_max_rounds, worst_case_noiseless_rounds
>>> params = SVTParams(partitions=5, epsilon=0.2, granularity=0.01)
>>> params.grid_size, worst_case_noiseless_rounds(params), default_max_rounds(params)
(100, 23, 46)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.curves.rdp import RDPCurve

__all__ = [
    "NON_RANDOMIZED",
    "RoundOutcome",
    "SVTParams",
    "SVTResult",
    "default_max_rounds",
    "noiseless_rounds",
    "run_svt",
    "svt_curve",
    "svt_round",
    "worst_case_noiseless_rounds",
]

THRESHOLD_NOISE_FACTOR = 2.0
"""Threshold noise Lap(2Δ/ε): Algorithm 1 line 16; Dwork & Roth Thm 3.23."""

QUERY_NOISE_FACTOR = 4.0
"""Query noise Lap(4Δ/ε): Algorithm 1 line 20; Dwork & Roth Thm 3.23."""

HEADROOM_FACTOR = 2
"""Default T_max = HEADROOM_FACTOR × the non-randomised worst case (:func:`default_max_rounds`)."""

MIN_GRANULARITY = 1e-9
"""Finest utility grid g: below any accuracy's resolution, and n = ⌈(1 − u0)/g⌉ must stay a sane count."""

MAX_PARTITIONS = 2**53
"""Most partitions k: 1/k and the Laplace scales stay exact doubles."""


@dataclass(frozen=True, kw_only=True)
class SVTParams:
    """The data-independent parameters of Algorithm 1's rounds.

    Attributes:
        partitions: k, the number of disjoint training partitions (sensitivity 1/k, Lemma 2).
        epsilon: ε of one round (pure ε-DP, Theorem 3 part I).
        granularity: g ∈ (0, 1), the utility grid.
        initial_utility: u0 ∈ [0, 1), the level the climb starts from.
    """

    partitions: int
    epsilon: float
    granularity: float
    initial_utility: float = 0.0

    def __post_init__(self) -> None:
        k = validate.positive_int("partitions", self.partitions, maximum=MAX_PARTITIONS)
        eps = validate.finite_positive("epsilon", self.epsilon)
        g = validate.in_range("granularity", self.granularity, MIN_GRANULARITY, 1.0, open_right=True)
        u0 = validate.in_range(
            "initial_utility", self.initial_utility, 0.0, 1.0, open_right=True, note=" (an accuracy)"
        )
        object.__setattr__(self, "partitions", k)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "granularity", g)
        object.__setattr__(self, "initial_utility", u0)
        if not math.isfinite(self.query_scale):
            raise ValueError(
                f"epsilon * partitions = {self.epsilon * self.partitions:g} is too small: the Laplace scale "
                f"4/(k·epsilon) overflows; epsilon must be >= {QUERY_NOISE_FACTOR / 1e308 / self.partitions:g}."
            )

    @property
    def sensitivity(self) -> float:
        """Δ = 1/k: each u_s is a mean of k accuracies in [0, 1], one per partition (Lemma 2)."""
        return 1.0 / self.partitions

    @property
    def threshold_scale(self) -> float:
        """2/(kε): Laplace scale of the threshold noise (line 16)."""
        return THRESHOLD_NOISE_FACTOR * self.sensitivity / self.epsilon

    @property
    def query_scale(self) -> float:
        """4/(kε): Laplace scale of each candidate's noise (line 20)."""
        return QUERY_NOISE_FACTOR * self.sensitivity / self.epsilon

    @property
    def grid_size(self) -> int:
        """The grid size n = ⌈(1 − u0)/g⌉: no level above n can be reached without noise, as every u_s ≤ 1."""
        return math.ceil((1.0 - self.initial_utility) / self.granularity)

    def utility(self, level: int) -> float:
        """The utility u = u0 + g·level the climb has reached (inf for a level beyond any double)."""
        return self.initial_utility + self.granularity * (float(level) if level < 2**1000 else math.inf)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record."""
        return {
            "partitions": self.partitions,
            "epsilon": self.epsilon,
            "granularity": self.granularity,
            "initial_utility": self.initial_utility,
        }


class _ZeroNoise:
    """A stand-in for a Generator whose Laplace draws are all 0: Definition 5's non-randomised world."""

    def laplace(self, loc: float = 0.0, scale: float = 1.0, size: Any = None) -> Any:
        return loc + np.zeros(size) if size is not None else float(loc)

    def __repr__(self) -> str:
        return "NON_RANDOMIZED"


NON_RANDOMIZED = _ZeroNoise()
"""Pass as ``rng`` to run Definition 5's non-randomised world (tests only: it is not private)."""


@dataclass(frozen=True)
class RoundOutcome:
    """What one round leaves: the new level (u = u0 + g·level), step and the candidate that passed."""

    level: int
    step: int
    chosen: int | None


def svt_round(utilities: np.ndarray, level: int, step: int, params: SVTParams, rng: Any) -> RoundOutcome:
    """One iteration of Algorithm 1's while loop (lines 15–33): an ε-DP AboveThreshold.

    Args:
        utilities: u_s for s = 0, ..., |S|-1, each in [0, 1]; shape ``(|S|,)``.
        level: the current level, u = u0 + g·level (an integer, so u does not drift).
        step: the current step (>= 1).
        params: k, ε, g, u0.
        rng: a ``numpy.random.Generator`` (or :data:`NON_RANDOMIZED` in tests).

    Returns:
        On a pass (lines 21–27): ``level + step``, ``2·step`` and the first passing index;
        otherwise (lines 30–33): ``level``, ``step // 2`` and None.

    Privacy: Dwork & Roth (2014) Theorem 3.23 with Δ = 1/k (Ding et al. Lemma 2):
    ε-DP, whatever ``level`` and ``step`` are.
    """
    level = validate.integer("level", level)
    step = validate.integer("step", step, minimum=1)  # >= 1 inside the loop
    threshold = params.utility(level + step) + rng.laplace(0.0, params.threshold_scale)  # line 16
    noisy = np.asarray(utilities, dtype=float) + rng.laplace(0.0, params.query_scale, size=len(utilities))  # line 20
    passed = np.flatnonzero(noisy >= threshold)  # line 21
    if passed.size:
        return RoundOutcome(level + step, 2 * step, int(passed[0]))  # lines 22-25, break at line 27
    return RoundOutcome(level, step // 2, None)  # line 31


@dataclass(frozen=True)
class SVTResult:
    """The outcome of the capped loop.

    Attributes:
        chosen: s*, the index of the last candidate that passed, or None (s* = ∅).
        rounds: how many rounds ran (≤ the cap).
        cap_hit: True when the cap stopped the loop before the step reached 0.
        level: the final level (u = u0 + g·level).
        step: the final step (0 unless the cap was hit).
    """

    chosen: int | None
    rounds: int
    cap_hit: bool
    level: int
    step: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready record (every field is a function of the rounds' DP outputs)."""
        return {
            "chosen": self.chosen,
            "rounds": self.rounds,
            "cap_hit": self.cap_hit,
            "level": self.level,
            "step": self.step,
        }


def run_svt(utilities: Any, params: SVTParams, *, max_rounds: int, rng: Any) -> SVTResult:
    """Algorithm 1, lines 12–34, stopped after at most ``max_rounds`` rounds.

    Args:
        utilities: u_s for each candidate, each in [0, 1] (Lemma 2 needs it).
        params: k, ε, g, u0.
        max_rounds: T_max >= 1, fixed before the data are seen; the search is accounted
            as ``max_rounds`` ε-DP rounds (:func:`svt_curve`) however many run.
        rng: a ``numpy.random.Generator`` (seeded from ``secrets`` in production).

    Raises:
        ValueError: a utility outside [0, 1] or not finite, no candidates, ``max_rounds`` < 1.
    """
    utilities = check_utilities(utilities)
    max_rounds = check_max_rounds(max_rounds)
    level, step, chosen, rounds = 0, 1, None, 0  # line 12
    while step != 0 and rounds < max_rounds:  # line 14, capped
        rounds += 1  # line 15
        outcome = svt_round(utilities, level, step, params, rng)
        level, step = outcome.level, outcome.step
        if outcome.chosen is not None:
            chosen = outcome.chosen
    return SVTResult(chosen=chosen, rounds=rounds, cap_hit=step != 0, level=level, step=step)


def check_utilities(utilities: Any) -> np.ndarray:
    """The utilities as a float array, refusing any outside [0, 1] (Lemma 2's premise)."""
    array = np.asarray(utilities, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"utilities must be a non-empty 1-D sequence, got shape {array.shape}.")
    if not np.all(np.isfinite(array)) or np.any(array < 0.0) or np.any(array > 1.0):
        raise ValueError(
            f"utilities must each lie in [0, 1] (an accuracy): the sensitivity 1/k of Lemma 2 depends on it; "
            f"got {array.tolist()}."
        )
    return array


def check_max_rounds(max_rounds: Any) -> int:
    """``max_rounds`` (T_max) as an int >= 1."""
    return validate.positive_int("max_rounds", max_rounds)


# ---------------------------------------------------------------------- the non-randomised world


def noiseless_rounds(target_level: int) -> int:
    """Rounds Algorithm 1 takes without noise when the best candidate reaches level ``target_level``.

    In Definition 5's world a round passes iff level + step ≤ L* = ``target_level``.
    Following Lemma 1's proof: write L* = 2^j − 1 + r with 0 ≤ r < 2^j. The step
    doubles through j passes (1, 2, ..., 2^{j−1}) to level 2^j − 1; then the descent
    from step 2^j to 0 fails j + 1 times and, for each of the m = popcount(r) bits of
    r, passes once and fails once more. Total 2m + 2j + 1 (the proof writes 2m + 2j:
    it counts j, not j + 1, halvings from 2^j to 0).

    Args:
        target_level: L* >= 0.
    """
    target_level = validate.integer("target_level", target_level, whole_floats=True)
    j = (target_level + 1).bit_length() - 1
    remainder = target_level + 1 - (1 << j)
    return 2 * remainder.bit_count() + 2 * j + 1


def worst_case_noiseless_rounds(params: SVTParams) -> int:
    """The maximum of :func:`noiseless_rounds` over every reachable L* ∈ {0, ..., n}, n = ⌈(1 − u0)/g⌉.

    Utilities are accuracies (≤ 1), so this bound holds whatever the data are. With
    J = ⌊log2(n + 1)⌋ and R = n + 1 − 2^J, the maximum is attained either at
    j = J with the r ≤ R of most one-bits, or at j = J − 1 with r = 2^{J−1} − 1
    (4J − 3 rounds).
    """
    n = params.grid_size
    top = (n + 1).bit_length() - 1  # J
    spare = n + 1 - (1 << top)  # R: r ranges over 0..R at j = J
    most_bits = max(spare.bit_count(), spare.bit_length() - 1)  # most one-bits of any r <= R
    best = 2 * most_bits + 2 * top + 1
    if top >= 1:
        best = max(best, 4 * top - 3)
    return best


def default_max_rounds(params: SVTParams) -> int:
    """T_max = 2 × :func:`worst_case_noiseless_rounds`: data-independent, no δ' needed.

    Rationale. Without noise, no data set makes the loop run longer than the worst
    case W ≈ 4·log2(n) + 1 (Lemma 1, over every L* ≤ n; 23 rounds for g = 0.01, u0 = 0).
    Noise adds rounds: a false pass lifts the level above max u_s and the step must
    descend again, a false fail halves the step early and the climb resumes (the paper's
    Fig. 4 reports a mean T ≈ 3·log n). Doubling W leaves room for a second
    non-randomised climb and descent after such detours. Measured (seeded simulation,
    |S| ∈ {6, 100}, utilities uniform on [0, 1] or clustered near 0.85, k = 5, 300 runs
    each; ``tests/search/test_constant_overhead.py`` re-checks one setting): with kε ≥ 5, the
    paper's recommended regime, the capped loop ends on the same s* as the uncapped
    Algorithm 1 in 97–100% of runs for n ∈ {20, 100, 1000} (W: 57–74% at n = 100;
    1.5·W: 93–96%); with kε = 1 in 94–96% for n ≥ 100. A run the cap stops keeps
    the s* found so far. The cap trades utility for privacy only; the guarantee
    (T_max · ε) holds for any T_max, so ``max_rounds`` may override it.
    """
    return HEADROOM_FACTOR * worst_case_noiseless_rounds(params)


# ---------------------------------------------------------------------- accounting


def svt_curve(*, epsilon: float, rounds: int, orders: np.ndarray | None = None) -> RDPCurve:
    """RDP of ``rounds`` adaptively composed ε-DP rounds: rounds · min(ε, αε²/2).

    Each round is ε-DP (Dwork & Roth Thm 3.23; Ding et al. Thm 3, part I); ε-DP gives
    RDP min(ε, αε²/2) (Bun & Steinke 2016, Prop. 3.3, and D_α ≤ D_∞), and RDP composes
    adaptively by addition (Mironov 2017, Prop. 1). Pass T_max, never the rounds used.
    """
    rounds = validate.positive_int("rounds", rounds)
    return RDPCurve.pure(epsilon=epsilon, orders=orders) * rounds
