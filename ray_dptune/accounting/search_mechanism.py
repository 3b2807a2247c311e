"""How a search is bounded: the kind of its mechanism and the parameters its bound needs.

A :class:`SearchMechanism` is JSON-ready (it is written to the journal and the report) and
turns a per-attempt plan curve into the curve of the attempts its bound covers
(:meth:`SearchMechanism.selection_curve`). :class:`ray_dptune.accounting.account.SearchAccount`
composes everything else.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_dptune import validate
from ray_dptune.accounting.distributions import RunCountDistribution, distribution_from_dict
from ray_dptune.accounting.rdp import RDPCurve
from ray_dptune.accounting.selection import repeat_and_select
from ray_dptune.accounting.svt import svt_curve

__all__ = ["MECHANISM_KINDS", "SearchMechanism"]

MECHANISM_KINDS = ("random_count", "constant_overhead", "release", "composition", "halving")
_DRAWN = frozenset({"num_trials", "num_brackets"})
"""Parameters drawn from a law before the search: the operator's, never in a public statement."""


@dataclass(frozen=True)
class SearchMechanism:
    """How a search is bounded, as JSON-ready parameters (build with the class methods)."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in MECHANISM_KINDS:
            raise ValueError(f"Unknown search mechanism {self.kind!r}; expected one of {MECHANISM_KINDS}.")

    @classmethod
    def random_count(
        cls, *, law: RunCountDistribution, num_trials: int, density_ratio: float = 1.0, upper: float | None = None
    ) -> SearchMechanism:
        """K ~ ``law`` runs, best released: P&S 2022 Thms 2/6; DP-HyPO Thm 1 when ``density_ratio`` = C/c > 1
        (``upper``: C itself, when the sampler guarantees it; see :func:`repeat_and_select`)."""
        params = {"law": law.to_dict(), "num_trials": int(num_trials), "density_ratio": float(density_ratio)}
        if upper is not None:
            params["upper"] = validate.in_range("upper", upper, 1.0, float(density_ratio), note=" (C, 1 <= C <= C/c)")
        return cls("random_count", params)

    @classmethod
    def constant_overhead(cls, *, epsilon_round: float, max_rounds: int) -> SearchMechanism:
        """Ding et al. Alg. 1: ``max_rounds`` ε_round-DP sparse-vector rounds per selection, then one training."""
        return cls("constant_overhead", {"epsilon_round": float(epsilon_round), "max_rounds": int(max_rounds)})

    @classmethod
    def release(cls, *, epsilon: float, delta: float, description: Mapping[str, Any] | None = None) -> SearchMechanism:
        """A searcher's own (ε, δ)-DP release (DP-BO, Kusner et al. 2015); trials are not accounted."""
        if not (math.isfinite(epsilon) and epsilon >= 0 and 0 <= delta < 1):
            raise ValueError(f"A release needs ε >= 0 finite and δ in [0, 1), got ({epsilon}, {delta}).")
        return cls(
            "release", {"epsilon": float(epsilon), "delta": float(delta), "description": dict(description or {})}
        )

    @classmethod
    def composition(cls) -> SearchMechanism:
        """Every accounted attempt composed at its plan (no selection theorem)."""
        return cls("composition", {})

    @classmethod
    def halving(
        cls, *, budget_units: int, max_t: int, law: RunCountDistribution | None = None, num_brackets: int = 1
    ) -> SearchMechanism:
        """Private successive halving: brackets of at most ``budget_units`` time units, a unit ``plan / max_t``.

        One bracket (``law`` None): the search costs ``budget_units`` units composed; K =
        ``num_brackets`` ~ ``law`` independent brackets, the best winner released: P&S Thms
        2/6 over that run (:mod:`~ray_dptune.accounting.halving_budget`).
        """
        budget_units = validate.integer("budget_units", budget_units, minimum=1)
        max_t = validate.integer("max_t", max_t, minimum=1)
        num_brackets = validate.integer("num_brackets", num_brackets)
        if law is None and num_brackets != 1:
            raise ValueError(f"num_brackets = {num_brackets} needs the law it was drawn from (law=).")
        law_record = None if law is None else law.to_dict()
        params = {"budget_units": budget_units, "max_t": max_t, "law": law_record, "num_brackets": num_brackets}
        return cls("halving", params)

    @property
    def cover_cap(self) -> int:
        """How many attempts (one per trial) the mechanism's own bound covers."""
        if self.kind == "random_count":
            return int(self.params["num_trials"])
        return 1 if self.kind == "constant_overhead" else 0

    @property
    def allows_retries(self) -> bool:
        """Whether Tune may re-run a trial that failed (``FailureConfig(max_failures > 0)``).

        Not under a random count's selection bound (P&S Thms 2/6, Lemma 7; DP-HyPO Thm 1): it
        covers the best of K runs with K hidden, each run one draw of the base. A retry is decided
        by the failure of the attempt it replaces, so the runs that stand as trials' last attempts
        are the base *conditioned on not failing*, and the retries are a statistic of all K runs
        (P&S App. D.1: with such a statistic known, best-of-k costs up to k-fold): exact
        enumeration finds the released output's ε above the bound (tests/test_exact_retries.py). A
        failure without a retry is covered: the run's output is "failed", ranked last. The other
        kinds bound every attempt outside their cover by adaptive composition (Mironov 2017,
        Prop. 1), which covers the failure a retry reveals.
        """
        return self.kind != "random_count"

    def retry_reserve(self, max_failures: int) -> int | None:
        """The attempts Tune's ``max_failures`` retries may charge in all: part of the stated guarantee.

        0 where retries are not charged by attempt (a halving budget pays units; a release's trials
        are not accounted); ``max_failures`` for each covered trial of a constant-overhead search
        (its final training); None where no fixed number bounds them (unlimited retries, or a plain
        composition of any number of trials).
        """
        if self.kind in ("halving", "release") or max_failures == 0:
            return 0
        if max_failures < 0 or self.kind == "composition":
            return None
        return max_failures * self.cover_cap

    @property
    def law(self) -> RunCountDistribution | None:
        return distribution_from_dict(self.params["law"]) if self.kind == "random_count" else None

    def selection_curve(self, plan: RDPCurve, *, selections: int = 1, generic: bool = True) -> RDPCurve:
        """The curve of the covered attempts when each satisfies ``plan``.

        ``selections`` counts the sparse-vector selections of a constant-overhead search
        that ran (each costs ``max_rounds`` rounds; at least one is charged from the start).
        """
        if self.kind == "halving":
            raise ValueError("A halving search's curve is its budget of plan units: read it from SearchAccount.")
        if self.kind == "random_count":
            law = self.law
            assert law is not None  # a random_count mechanism always has its law
            return repeat_and_select(
                plan,
                law,
                density_ratio=self.params["density_ratio"],
                upper=self.params.get("upper"),
                generic=generic,
            )
        if self.kind == "constant_overhead":
            rounds = svt_curve(
                epsilon=self.params["epsilon_round"], rounds=self.params["max_rounds"], orders=plan.orders
            )
            return max(1, selections) * rounds + plan
        return RDPCurve.zero(plan.orders)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": json.loads(json.dumps(dict(self.params)))}

    def public_definition(self) -> dict[str, Any]:
        """The mechanism as it may be published: its record without the draws the bound keeps hidden.

        The selection bounds cover the best run with the number of runs hidden (P&S 2022, App. D.1:
        with K known, best-of-k costs up to k-fold), so K (``num_trials``) and the number of halving
        brackets (``num_brackets``) are the operator's; the law they were drawn from is public.
        """
        record = self.to_dict()
        record["params"] = {k: v for k, v in record["params"].items() if k not in _DRAWN}
        return record

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> SearchMechanism:
        return cls(record["kind"], dict(record.get("params", {})))
