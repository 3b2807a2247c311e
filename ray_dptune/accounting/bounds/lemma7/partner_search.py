"""Certified lower bounds on the lowest partner q' that an RDP curve allows a two-point output.

One [0, 1]-valued post-processing of a mechanism gives probabilities (q, q') on two
neighbouring inputs, and for every constraint order α of its RDP curve (data processing,
both directions as neighbouring is symmetric)

    D_α(Bern(q)‖Bern(q')) ≤ ε(α)   and   D_α(Bern(q')‖Bern(q)) ≤ ε(α).

For a grid of q this module bounds b(q) = min{q' ≤ q allowed} from below, which P&S
Lemma 7 and DP-HyPO Lemma A.5 need (:mod:`ray_dptune.accounting.bounds.lemma7.worst_pair`).

Why a point is certified. Rényi divergence is jointly quasi-convex for α ∈ [0, ∞] (van
Erven & Harremoës 2014, "Rényi divergence and Kullback-Leibler divergence", IEEE Trans.
Inf. Theory 60(7), Theorem 13), so each constraint allows an interval of q' around q and
all of them together allow [b(q), ·]; b is convex with b(0) = 0, so non-decreasing. A
point x ≤ q where one single constraint is *violated* therefore lies below b(q), whatever
the other constraints say. A point is kept only when its evaluated excess, log S(x) - c
below, beats a bound on its floating-point error (:data:`ROUNDING`): rounding can cost
tightness, never validity. A missed constraint likewise only leaves a bound lower.

Constraint k, a direction and an order α: with S = q^α x^(1-α) + (1-q)^α (1-x)^(1-α) for
D_α(Bern(q)‖Bern(x)) (the first direction) or x^α q^(1-α) + (1-x)^α (1-q)^(1-α), it reads
log S(x) ≤ c = (α-1)·ε(α). Keys order the 2m constraints as their boundaries tend to lead
when q grows: the first direction by decreasing α, then the second by increasing α. Orders
whose (α, (α-1)·ε(α)) lies above the lower convex hull are dropped first: they cannot bind
(:func:`_binding`).

How. Newton's method per (constraint, point), in t = log x (first direction) or log(1-x)
(second), aiming just inside the violated side (:meth:`_Pairs.newton`). Every constraint
is solved at every ``LEVELS[0][0]``-th grid point; the points of each later level start
from the chord of their solved neighbours and solve only the constraints that bind at
those neighbours (and the ones between). :class:`PartnerSearch` also checks a point
against every constraint (``unsettled``) and re-solves it in full (``refine``).
"""

from __future__ import annotations

import numpy as np

from ray_dptune import validate
from ray_dptune.accounting.curves.rdp import RDPCurve

__all__ = ["MAX_CONSTRAINT_ORDERS", "PartnerSearch", "constraint_orders", "lowest_partner"]

CONSTRAINT_SLACK = 1e-9
"""Relative and absolute slack on ε(α) that Newton aims at, as the bisection it replaces did (or
:data:`AIM` error bounds where those are more): the bound it finds violates its constraint by
that much, so that it is certified although Newton cannot land exactly on the boundary."""
MAX_CONSTRAINT_ORDERS = 48
"""Default cap on the constraint orders (evenly spread): fewer allow more (q, q'), a valid but
looser bound, and the work grows with them. The generic bound has always used 48."""
ROUNDING = 16 * np.finfo(float).eps
"""Error allowed per unit of each term of an evaluated excess: numpy's log, exp, log1p and expm1
err by a few ulp, and the sums by one each; 16 ulp per term covers them with room."""
AIM = 4.0
"""Newton aims at an excess of the slack, or of AIM error bounds where that is more."""
VERIFY = 2.0
"""A constraint is clearly violated at a bound when its excess passes the aim by VERIFY errors."""
NEWTON_STEPS = 8
STRAGGLER_STEPS = 40
LEVELS = ((64, 0, 0), (8, 96, 5), (1, 96, 3))
"""Per level: every n-th grid point, the most keys spanned between the neighbours' binding ones
(more: those two alone), Newton steps. Level 0 solves every key."""


def constraint_orders(
    curve: RDPCurve, *, max_orders: int | None = MAX_CONSTRAINT_ORDERS
) -> tuple[np.ndarray, np.ndarray]:
    """The finite orders of ``curve`` (at most ``max_orders``, evenly spread; None: all), smoothed, and their ε.

    Smoothed: ε̃(α) = min over α' ≥ α of ε(α') (as :meth:`RDPCurve.smoothed`), valid for the
    two-point laws constrained here, whose divergence is non-decreasing in the order. More
    orders only tighten the result when they include the fewer ones (None includes all).
    """
    smooth = np.minimum.accumulate(curve.epsilons[::-1])[::-1]
    finite = np.isfinite(smooth)
    alphas: np.ndarray = curve.orders[finite]
    eps: np.ndarray = smooth[finite]
    if max_orders is not None and alphas.size > validate.positive_int("max_constraint_orders", max_orders):
        keep = np.unique(np.linspace(0, alphas.size - 1, max_orders).round().astype(int))
        alphas, eps = alphas[keep], eps[keep]
    return alphas, eps


class _Pairs:
    """(constraint, point) pairs, flattened.

    S = e^A + e^B with A = w·t + (1-w)·L and B = w·log(1 - e^t) + (1-w)·M, where w = 1 - α,
    t = log x, (L, M) = (log q, log(1-q)) for the first direction and w = α, t = log(1-x),
    (L, M) = (log(1-q), log q) for the second.
    """

    def __init__(self, table: dict[str, np.ndarray], keys: np.ndarray, lq: np.ndarray, l1q: np.ndarray):
        """Pairs of constraint ``keys`` (rows of ``table``, see :class:`_Constraints`) and points.

        The points have log q = ``lq`` and log(1-q) = ``l1q``.
        """
        self.w, self.w1, self.e1 = table["w"][keys], table["w1"][keys], table["e1"][keys]
        self.c, self.slack = table["c"][keys], table["slack"][keys]
        self.first, self.sign = table["first"][keys], table["sign"][keys]
        near, far = np.where(self.first, lq, l1q), np.where(self.first, l1q, lq)
        u = table["u"][keys]
        self.a0, self.b0 = u * near, u * far
        self.e0 = self.e1 * (np.abs(lq) + np.abs(l1q) + 4.0) + table["ec"][keys]
        self.low = np.where(self.first, -700.0, near)  # t's range: x in [~0, q]
        self.high = np.where(self.first, near, 0.0)

    def subset(self, index: np.ndarray) -> _Pairs:
        out = object.__new__(_Pairs)
        out.__dict__.update({name: value[index] for name, value in self.__dict__.items()})
        return out

    def start(self) -> np.ndarray:
        """Where A alone reaches c, in closed form: S > e^c there, a violated point."""
        t: np.ndarray = np.minimum(np.maximum((self.c - self.a0) / self.w, self.low), self.high)
        return t

    def t_of(self, x: np.ndarray) -> np.ndarray:
        t: np.ndarray = np.minimum(np.maximum(np.where(self.first, np.log(x), np.log1p(-x)), self.low), self.high)
        return t

    def x_of(self, signed: np.ndarray) -> np.ndarray:
        """The x at t = sign·``signed``, rounded down; -inf: 0.

        Rounded down by 8 ulp (past exp's and expm1's own error, so the float x lies below the real
        one, which is certified), then one step more toward 0 (where x is subnormal, the relative step
        is lost).
        """
        x = np.where(self.first, np.exp(signed), -np.expm1(-signed)) * (1.0 - 8.0 * np.finfo(float).eps)
        return np.where(signed == -np.inf, 0.0, np.nextafter(x, 0.0))

    def aim(self, err: np.ndarray) -> np.ndarray:
        aim: np.ndarray = np.maximum(self.slack, AIM * err)
        return aim

    def evaluate(self, t: np.ndarray) -> tuple[np.ndarray, ...]:
        """Returns log S - c, its error bound, log S, A, and B - log(1 - e^t), at t."""
        gap, log_sum, a, b_rest, other = self._excess(t)
        return gap, self.error(t, other), log_sum, a, b_rest

    def error(self, t: np.ndarray, other: np.ndarray) -> np.ndarray:
        """The bound on the floating-point error of the excess at t, where ``other`` = log(1 - e^t).

        :data:`ROUNDING` per unit of each term (the logs of q, 1 - q, x, 1 - x; c; the sums).
        """
        err: np.ndarray = self.e0 - self.e1 * (t + np.maximum(other, -800.0))
        return err

    def _excess(self, t: np.ndarray) -> tuple[np.ndarray, ...]:
        other = np.log(-np.expm1(t))
        a, b = self.w * t + self.a0, self.w * other + self.b0
        top = np.maximum(a, b)
        log_sum = top + np.log(1.0 + np.exp(np.minimum(a, b) - top))
        return log_sum - self.c, log_sum, a, self.w1 * other + self.b0, other

    def solve(self, t: np.ndarray, iterations: int) -> np.ndarray:
        """Certified lower bounds on each boundary (x; 0 where none), from t.

        ``iterations`` Newton steps, then up to :data:`STRAGGLER_STEPS` more, each iterate certified
        and the best kept, for the pairs not yet at their aim.
        """
        best, t, done = self.newton(t, iterations)
        late = np.nonzero(~done)[0]
        if late.size:
            best[late] = np.maximum(best[late], self.subset(late).newton(t[late], STRAGGLER_STEPS, every=True)[0])
        return self.x_of(best)

    def newton(
        self, t: np.ndarray, iterations: int, *, every: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Certified bounds as sign·t (-inf: none), the last t, and which pairs sit at their aim.

        Only the last iterate is certified (its excess must beat its error bound), or with
        ``every`` each iterate, keeping the best. The steps aim with the error bound of the
        first iterate (it varies little). A step out of t's range, or NaN, lands on the range's
        end (fmax and fmin drop NaN).
        """
        gap, log_sum, a, b_rest, other = self._excess(t)
        err = self.error(t, other)
        aim = self.aim(err)
        best = np.full_like(t, -np.inf)
        for step in range(iterations + 1):
            if step:
                gap, log_sum, a, b_rest, other = self._excess(t)
            if every:
                best = np.where(gap > self.error(t, other), np.maximum(best, self.sign * t), best)
            if step == iterations or (step >= 2 and np.all(np.abs(gap - aim) <= err)):
                break
            slope = self.w * (np.exp(a - log_sum) - np.exp(b_rest + t - log_sum))  # d log S / dt
            t = np.fmin(np.fmax(self._step(t, gap - aim, slope), self.low), self.high)
        err = self.error(t, other)  # at the last iterate
        certified = gap > err
        done = (certified & (np.abs(gap - self.aim(err)) <= err)) | ~np.isfinite(gap)  # NaN or inf: no progress
        return np.maximum(best, np.where(certified, self.sign * t, -np.inf)), t, done

    def _step(self, t: np.ndarray, excess: np.ndarray, slope: np.ndarray) -> np.ndarray:
        """Newton's step, written in t.

        On log S in t for the first direction, where log S is convex (so a step from either side
        lands on the violated one) and exact where one term dominates; for the second, on S in x
        (convex there: the same holds), or on log S in t when, from the violated side, that goes
        further (it is exact where one term dominates, as far from the boundary).
        """
        # the step on S in x, written in t (the step need not be exact: each iterate is evaluated)
        linear = t + np.log1p(np.expm1(-excess) / slope)
        logarithmic = t - excess / slope
        further = self.sign * logarithmic > self.sign * linear
        result: np.ndarray = np.where(self.first | ((excess > 0) & further), logarithmic, linear)
        return result


class _Constraints:
    """The finite constraints of a curve, by key (see the module docstring): a table of per-key constants."""

    def __init__(self, alphas: np.ndarray, epsilons: np.ndarray):
        alphas, epsilons = np.asarray(alphas, dtype=float), np.asarray(epsilons, dtype=float)
        with np.errstate(over="ignore"):  # (α − 1)ε past 1e308: no constraint, dropped (a looser bound)
            limits = (alphas - 1.0) * np.array([epsilons, CONSTRAINT_SLACK * (1.0 + epsilons)])
        keep = np.all(np.isfinite(limits), axis=0)
        keep[keep] = _binding(alphas[keep], limits[0, keep])
        alphas, c, slack = alphas[keep], limits[0, keep], limits[1, keep]
        self.keys = 2 * alphas.size
        first = np.arange(self.keys) < alphas.size
        alpha, c = np.r_[alphas[::-1], alphas], np.r_[c[::-1], c]
        w = np.where(first, 1.0 - alpha, alpha)
        self.table = {
            "w": w,
            "w1": w - 1.0,
            "u": 1.0 - w,
            "c": c,
            "slack": np.r_[slack[::-1], slack],
            "first": first,
            "sign": np.where(first, 1.0, -1.0),  # sign·t grows with x
            "e1": ROUNDING * np.maximum(np.abs(w), np.abs(1.0 - w)),
            "ec": ROUNDING * (np.abs(c) + 1.0),
        }

    def pairs(self, keys: np.ndarray, lq: np.ndarray, l1q: np.ndarray) -> _Pairs:
        return _Pairs(self.table, keys, lq, l1q)

    def solve(
        self, keys: np.ndarray, q: np.ndarray, point: np.ndarray, start: np.ndarray, iterations: int
    ) -> np.ndarray:
        """Certified bounds for each (key, point) pair, Newton from x = ``start``."""
        pairs = self.pairs(keys, np.log(q[point]), np.log1p(-q[point]))
        return pairs.solve(pairs.t_of(np.minimum(start, q[point])), iterations)

    def solve_all(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Certified bounds at interior points ``q`` from every constraint, and the key that binds.

        Each constraint's closed-form start that is certified violated bounds b from below; at
        the largest, x0, every constraint is evaluated, and those not certainly allowed there
        (their boundary may lie above x0; the binding one is among them) are solved from x0.
        """
        n, lq, l1q = q.size, np.log(q), np.log1p(-q)
        every, point = np.repeat(np.arange(self.keys), n), np.tile(np.arange(n), self.keys)
        pairs = self.pairs(every, lq[point], l1q[point])
        t0 = pairs.start()
        gap, err = pairs.evaluate(t0)[:2]
        starts = np.where(gap > err, pairs.x_of(pairs.sign * t0), 0.0).reshape(self.keys, n)
        best, binding = starts.max(axis=0), np.argmax(starts, axis=0)
        binding = np.where(best > 0.0, binding, -1)
        gap, err = pairs.evaluate(pairs.t_of(best[point]))[:2]
        active = ~(gap < -err)
        keys, near = every[active], point[active]
        found = self.solve(keys, q, near, best[near], NEWTON_STEPS)
        # the binding key is the one whose boundary Newton put highest (a start can beat that by
        # lying nearer the boundary than the slack Newton aims at, without binding)
        top, solved = _record(np.zeros(n), np.full(n, -1), found, keys, near)
        return np.maximum(best, top), np.where(solved >= 0, solved, binding)


def _binding(alphas: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Which constraints can bind: those on the lower convex hull of (1, 0) and (α, (α-1)·ε(α)).

    For any pair of laws, α ↦ (α-1)·D_α is convex (the log of a sum of exponentials of α) and
    vanishes at α = 1, so a constraint lying above the chord of two others (or of (1, 0) and
    one other) is implied by them: dropping it leaves the allowed set as it is. A drop needs a
    margin over rounding; a wrong one would only enlarge the set (a looser bound, still valid).
    Andrew's monotone chain, in order of α (a few dozen points).
    """
    x, y = np.r_[1.0, alphas], np.r_[0.0, c]
    if x.size <= 2:
        return np.ones(alphas.size, dtype=bool)
    with np.errstate(over="ignore"):  # a margin past 1e308 is inf: nothing is dropped (the set as it is)
        chord = y[:-2] + (y[2:] - y[:-2]) * ((x[1:-1] - x[:-2]) / (x[2:] - x[:-2]))
        above = y[1:-1] > chord + 1e-12 * (np.abs(chord) + np.abs(y[1:-1]))
    if not np.any(above):
        return np.ones(alphas.size, dtype=bool)  # already convex (a Gaussian's curve, say)
    xs, ys = x.tolist(), y.tolist()
    hull = [0]
    for i in range(1, len(xs)):
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            chord = ys[o] + (ys[i] - ys[o]) * (xs[a] - xs[o]) / (xs[i] - xs[o])
            if ys[a] <= chord + 1e-12 * (abs(chord) + abs(ys[a])):
                break
            hull.pop()
        hull.append(i)
    keep = np.zeros(alphas.size, dtype=bool)
    keep[np.asarray(hull[1:], dtype=int) - 1] = True
    return keep


def _record(
    best: np.ndarray, binding: np.ndarray, found: np.ndarray, keys: np.ndarray, point: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each point's larger of ``best`` and its largest ``found``, and the key that gave it."""
    new = np.zeros(best.size)
    np.maximum.at(new, point, found)
    wins = (found >= new[point]) & (new[point] > best[point])
    binding = binding.copy()
    binding[point[wins]] = keys[wins]
    return np.maximum(best, new), binding


def _windows(lo: np.ndarray, hi: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys lo[i]..hi[i] where that spans fewer than ``width`` keys, else lo[i] and hi[i] alone.

    Flattened, with their row i.
    """
    joint = hi - lo < width
    count = np.where(joint, hi - lo + 1, 2)
    row = np.repeat(np.arange(lo.size), count)
    offset = np.arange(row.size) - np.repeat(np.cumsum(count) - count, count)
    return lo[row] + offset * np.where(joint, 1, hi - lo)[row], row


class PartnerSearch:
    """Certified lower bounds on b at the points of a sorted grid ``q`` (0 and 1 included), level by level.

    ``known``: solved; ``steady``: solved from neighbours bound by the constraint that binds it
    too (no change of binding constraint nearby, where a window of keys could miss one).
    Call :meth:`solve_top` first, then :meth:`solve_level` for the later levels.
    """

    def __init__(self, q: np.ndarray, alphas: np.ndarray, epsilons: np.ndarray):
        self.q = q
        self.constraints = _Constraints(alphas, epsilons)
        self.p = np.zeros_like(q)
        self.binding = np.full(q.size, -1)
        self.known = np.zeros(q.size, dtype=bool)
        self.steady = np.zeros(q.size, dtype=bool)
        interior = np.nonzero((q > 0.0) & (q < 1.0))[0]
        self.interior = interior if self.constraints.keys else interior[:0]

    def solve_top(self) -> None:
        """Every constraint, at every ``LEVELS[0][0]``-th interior point and the last."""
        if self.interior.size:
            top = np.unique(np.r_[self.interior[:: LEVELS[0][0]], self.interior[-1]])
            self.p[top], self.binding[top] = self.constraints.solve_all(self.q[top])
            self.known[top] = True

    def solve_level(self, new: np.ndarray, width: int, iterations: int) -> None:
        """Solves the interior points ``new`` not yet solved: Newton from the chord of their solved neighbours.

        After :meth:`solve_top`, every interior point has a solved neighbour on each side.
        """
        new = new[~self.known[new]]
        if new.size == 0:
            return
        solved = np.nonzero(self.known)[0]
        index = np.searchsorted(solved, new)
        left, right = solved[index - 1], solved[index]
        q, p, qn = self.q, self.p, self.q[new]
        self.known[new] = True
        pl = p[new] = p[left]  # b is non-decreasing
        bl, br = self.binding[left], self.binding[right]
        bl, br = np.where(bl < 0, br, bl), np.where(br < 0, bl, br)  # one side unknown: the other's
        chord = pl + (p[right] - pl) * ((qn - q[left]) / (q[right] - q[left]))
        go = np.nonzero(bl >= 0)[0]
        if go.size < new.size:
            new, qn, chord, bl, br = new[go], qn[go], chord[go], bl[go], br[go]
        # the neighbours' binding keys, and all between them if that is short
        keys, point = _windows(np.minimum(bl, br), np.maximum(bl, br), width)
        lq, l1q = np.log(qn), np.log1p(-qn)
        pairs = self.constraints.pairs(keys, lq[point], l1q[point])
        found = pairs.solve(pairs.t_of(chord[point]), iterations)
        best, binding = _record(np.zeros(new.size), np.full(new.size, -1), found, keys, point)
        self.p[new], self.binding[new] = np.maximum(self.p[new], best), binding
        self.steady[new] = (bl == br) & (binding == bl)

    def partner(self) -> np.ndarray:
        """The bounds as a running max (b is non-decreasing, so a running max of lower bounds is one)."""
        result: np.ndarray = np.maximum.accumulate(self.p)
        return result

    def unsettled(self, at: np.ndarray) -> np.ndarray:
        """The points of ``at`` where a constraint is clearly violated just above p (b lies higher)."""
        at = at[(self.q[at] > 0.0) & (self.q[at] < 1.0)]
        keys = self.constraints.keys
        if at.size == 0 or keys == 0:
            return at
        n, q = at.size, self.q[at]
        point = np.tile(np.arange(n), keys)
        pairs = self.constraints.pairs(np.repeat(np.arange(keys), n), np.log(q)[point], np.log1p(-q)[point])
        above = np.minimum(self.partner()[at] * (1.0 + 16.0 * np.finfo(float).eps), q)  # past x_of's rounding
        gap, err = pairs.evaluate(pairs.t_of(above[point]))[:2]
        result: np.ndarray = at[np.any((gap > pairs.aim(err) + VERIFY * err).reshape(keys, n), axis=0)]
        return result

    def refine(self, at: np.ndarray) -> bool:
        """Solve the points ``at`` against every constraint; whether a bound rose beyond rounding."""
        at = at[(self.q[at] > 0.0) & (self.q[at] < 1.0)]
        if at.size == 0 or self.constraints.keys == 0:
            return False
        before = self.partner()[at]
        found, binding = self.constraints.solve_all(self.q[at])
        rose = found > before * (1.0 + 1e-12)
        self.p[at] = np.maximum(self.p[at], found)
        self.binding[at[rose]] = binding[rose]
        return bool(rose.any())


def lowest_partner(q: np.ndarray, alphas: np.ndarray, epsilons: np.ndarray) -> np.ndarray:
    """Certified lower bounds p ≤ b(q) at every point of the sorted grid ``q`` (0 and 1 included).

    Args:
        q: grid on [0, 1], increasing (shape: n).
        alphas: constraint orders, each > 1 (shape: m).
        epsilons: ε at those orders (inf: no constraint).

    Returns:
        Shape n, non-decreasing; p[0] = 0.
    """
    search = PartnerSearch(q, alphas, epsilons)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        search.solve_top()
        for every, width, iterations in LEVELS[1:]:
            search.solve_level(search.interior[::every], width, iterations)
    return search.partner()
