"""private_tuner: from a privacy budget for the whole search to a ready ``tune.Tuner``."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ray import tune

from ray_dptune import validate
from ray_dptune.accounting.bookkeeping.calibrate import (
    calibrate_noise_multiplier,
    calibrate_subsampled_tuning,
    search_epsilon,
)
from ray_dptune.accounting.bookkeeping.spend import TrialSpend
from ray_dptune.accounting.bounds.distributions import RunCountDistribution
from ray_dptune.errors import PrivacyError, UnsupportedBoundError
from ray_dptune.result_keys import NOISE_KEY, SAMPLE_KEY, SEARCH_PLAN_KEY
from ray_dptune.search.base import PrivateSearcher, private_searcher_of
from ray_dptune.search.random_count import RandomCountSearcher
from ray_dptune.search.subsampled import SubsampledTuningSearcher
from ray_dptune.tune.accountant import PrivacyAccountantCallback
from ray_dptune.tune.guard import check_retries, check_stop, private_tune_config, require_selection_rule
from ray_dptune.tuning_sample import planned_sample_size

if TYPE_CHECKING:
    from ray_dptune.training.canaries import CanaryAudit

__all__ = ["private_tuner"]

_SEARCHER_OWNED = ("search_alg", "num_samples", "metric", "mode")


def private_tuner(
    trainable: Any,
    *,
    param_space: Mapping[str, Any],
    epsilon: float,
    delta: float,
    law: RunCountDistribution | None = None,
    searcher: PrivateSearcher | None = None,
    plan_for: Callable[[float], TrialSpend] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    tune_config: tune.TuneConfig | None = None,
    run_config: tune.RunConfig | None = None,
    generic: bool = True,
    retries: int | None = None,
    ledger: Any = None,
    dataset: str | None = None,
    verbose: bool = True,
    audit: CanaryAudit | None = None,
    tuning_fraction: float | None = None,
    final_noise_overhead: float = 0.1,
) -> tune.Tuner:
    """A ``tune.Tuner`` whose whole search is (``epsilon``, ``delta``)-DP, calibrated before any trial.

    Finds the smallest DP-SGD noise multiplier σ whose search — the searcher's mechanism
    over every trial's plan, as the account computes it — meets the budget (the upper end
    of a bisection, so never above it), puts σ into ``param_space`` as the constant
    ``"noise_multiplier"`` (so ``tune.Tuner.restore(path, trainable)`` works as in Tune),
    and installs the accountant callback (with ``target_epsilon=epsilon``: a hard cap) and
    the FIFO guard.

    The budget holds under every fault the search controls: no attempt starts whose charge
    would cross it. A failed trial costs nothing more: it is one of the runs, with output
    "failed", never released. A random-count search refuses Tune's retries of failed trials
    (``FailureConfig(max_failures > 0)``) before any trial: the selection bound does not cover
    what a retry reveals (:func:`~ray_dptune.tune.guard.check_retries`). A re-run of an
    interrupted trial on ``Tuner.restore`` costs one more run composed at the plan, so σ is
    calibrated with ``retries`` of them reserved, and a re-run beyond them is refused. A
    search that does not finish is incomplete and is not released.

    Mistakes are refused before any trial trains: no selection rule, a ``metric`` the
    ``dp_trainable`` does not report; for a loop of your own, the plan is put into every
    config (``"dp_search_plan"``) and ``OpacusSpend(..., config=config)`` refuses a loader,
    σ or step count past it before the first step
    (:class:`~ray_dptune.errors.RefusedBeforeTraining`: the search stops, ε = 0).

    Args:
        trainable: a :func:`~ray_dptune.training.dp_trainable` built without ``noise_multiplier``.
        param_space: Tune's search space (``tune.loguniform``, ``tune.choice``, ...).
        epsilon: ε of the whole search.
        delta: δ of the whole search.
        law: law of the number of trials K for a :class:`RandomCountSearcher` (e.g. ``Poisson(mean=8)``).
        searcher: any DP searcher instead of ``law`` (DP-HyPO, constant overhead), or a
            ``ConcurrencyLimiter`` around one.
        plan_for: for a trainable of your own (your Opacus loop reading ``config["noise_multiplier"]``
            and reporting :class:`~ray_dptune.training.OpacusSpend`): σ → the plan of one trial,
            e.g. :func:`~ray_dptune.training.opacus_plan`. Not needed for a ``dp_trainable``.
        metric: the metric to select on (default: the searcher's).
        mode: "max" or "min" (default: the searcher's).
        tune_config: other ``tune.TuneConfig`` settings (``max_concurrent_trials``, ...); its
            ``search_alg`` and ``num_samples`` belong to the private search.
        run_config: ``tune.RunConfig`` passed through; the accountant is added to its callbacks.
        generic: also use the certified numeric P&S Lemma 7 bound and the base's exact profile (the
            default, the tightest; False: closed forms only, the cross-check).
        retries: re-runs the budget reserves over the whole search, each composed at the plan: of
            interrupted trials on ``Tuner.restore`` (and, in searches whose bound composes every
            attempt, of failed trials Tune retries). Default: 0 for a random-count search, else
            ``run_config.failure_config.max_failures`` (0 when unset); needed when that is -1.
        ledger: a :class:`~ray_dptune.records.ledger.PrivacyLedger`; ``dataset`` names the data set.
            The report then also gives every search on it (``epsilon_dataset``); ``epsilon`` still
            caps this search's own guarantee.
        dataset: identifier of the private data set, with ``ledger``.
        verbose: print ε live.
        audit: a :class:`~ray_dptune.training.CanaryAudit` to audit the search in this one run:
            its canaries go into every trial's training set (σ is calibrated at that size), and
            :func:`~ray_dptune.release_best` puts the released model's ε_lower beside the
            proven ε in the report (``ray-dptune audit FOLDER`` prints both). Restore with
            ``tune.Tuner.restore(path, trainable.with_audit(CanaryAudit.from_journal(path)))``. A loop of your own
            (``plan_for=``) trains on ``audit.training_set(train_set)`` at q = batch_size /
            ``audit.planned_size(n)`` and adds ``{"dp_audit": counts.to_dict()}`` to its last
            report (:class:`~ray_dptune.training.canaries.CanaryScorer`).
        tuning_fraction: tune on a secret Poisson sample of this rate, then train the best configuration once on
            all the data (:class:`~ray_dptune.search.subsampled.SubsampledTuningSearcher`, with ``law=`` and a
            ``dp_trainable``): the budget is split into the tuning trials' σ_T (``param_space``'s
            ``"noise_multiplier"``) and the final run's σ_B, and the final trial is the released one.
        final_noise_overhead: with ``tuning_fraction``, σ_B is (1 + this) times the σ one untuned run alone
            would need for the budget; the tuning gets what that leaves (default 0.1).

    Raises:
        PrivacyError: no noise multiplier meets the budget (e.g. the score releases alone exceed it).
        UnsupportedBoundError: a searcher whose budget is not set by DP-SGD noise (DP-BO).
        ValueError: invalid arguments.
    """
    _check_budget(epsilon, delta)
    metric, mode = _selection_rule(metric, mode, tune_config)
    search_alg = searcher
    subsampled = None
    if tuning_fraction is not None and ledger is not None:
        raise UnsupportedBoundError(
            "A privacy ledger composes searches by their RDP curves; a subsampled tuning's guarantee is an (ε, δ) from "
            "privacy loss distributions, with no curve to compose: run tuning_fraction= without a ledger."
        )
    if tuning_fraction is not None:
        subsampled = _subsampled_search(
            trainable,
            dict(param_space),
            law=law,
            searcher=searcher,
            plan_for=plan_for,
            audit=audit,
            tuning_fraction=tuning_fraction,
            final_noise_overhead=final_noise_overhead,
            epsilon=epsilon,
            delta=delta,
            retries=retries or 0,
            generic=generic,
            metric=metric,
            mode=mode,
        )
        searcher, law = subsampled.searcher, None
    searcher = _searcher(law, searcher, metric, mode)
    search_alg = searcher if search_alg is None else search_alg  # the user's ConcurrencyLimiter stays around it
    mechanism = searcher.privacy_mechanism()
    if mechanism.releases_itself:
        raise UnsupportedBoundError(
            f"{type(searcher).__name__} protects its validation set with its own release (its epsilon= and "
            "delta=), not with DP-SGD noise: build its tune.Tuner with PrivacyAccountantCallback directly."
        )
    if plan_for is None and not (hasattr(trainable, "privacy_plan") and hasattr(trainable, "dataset_size")):
        raise TypeError(
            f"trainable {type(trainable).__name__} is not a ray_dptune.training.dp_trainable: pass plan_for= "
            "(σ -> the plan of one trial, e.g. ray_dptune.training.opacus_plan(...)) for a trainable of your own."
        )
    if audit is not None and hasattr(trainable, "with_audit"):
        trainable = trainable.with_audit(audit)  # before planning: the canaries change the training set's size
    if plan_for is not None and not searcher.accepts_plan_for:
        raise ValueError(
            f"{type(searcher).__name__}'s trials are planned by a dp_trainable; plan_for= is not supported."
        )
    for key in (NOISE_KEY, SEARCH_PLAN_KEY):
        if key in param_space:
            raise ValueError(f"param_space must not set {key!r}: private_tuner sets it from the budget.")
    _check_reported_metric(trainable, searcher.metric)
    if not param_space and searcher.needs_space:
        raise ValueError(
            f"param_space is empty: {type(searcher).__name__} draws every trial's hyperparameters from it. Give the "
            "space to search, e.g. {'lr': tune.loguniform(0.05, 4.0)}."
        )
    tuning = _tune_config(search_alg, tune_config, metric=metric, mode=mode)  # cheap checks before calibrating
    if run_config is not None:
        check_stop(run_config.stop)
    require_selection_rule(searcher)
    max_failures = _max_failures(run_config)
    check_retries(max_failures, searcher)
    retries = _reserved_retries(retries, max_failures, mechanism)
    own_loop = plan_for is not None
    plan_for = plan_for or _plan_factory(trainable, dict(param_space), searcher)
    if subsampled is None:
        sigma = calibrate_noise_multiplier(
            plan_for, epsilon=epsilon, delta=delta, mechanism=mechanism, generic=generic, retries=retries
        )
        plan = plan_for(sigma)
    else:  # the split is calibrated with the searcher: σ and the plan here are the tuning trials'
        plan = subsampled.tuning_plan
        sigma = plan.noise_multiplier
    spent = search_epsilon(plan, delta=delta, mechanism=mechanism, generic=generic, retries=retries)
    if spent > epsilon:  # calibrate returns the safe end; this is the account's own word on it
        raise PrivacyError(f"The calibrated search spends ε = {spent:.6g} > {epsilon}: refusing to run it.")
    if verbose and subsampled is not None:
        print(
            f"[ray_dptune] tuning on a {subsampled.searcher.tuning_fraction:g} Poisson sample at σ_T = {sigma:.6g} "
            f"(param_space[{NOISE_KEY!r}]), then one run on all the data at σ_B = "
            f"{subsampled.final_noise_multiplier:.6g}: the whole procedure's guarantee is ε = {spent:.4g} "
            f"(target ε = {epsilon:g}, δ = {delta:g})",
            flush=True,
        )
    elif verbose:
        reserved = f" with {retries} re-run(s) reserved" if retries else ""
        print(
            f"[ray_dptune] noise multiplier σ = {sigma:.6g} (param_space[{NOISE_KEY!r}]): the smallest whose whole "
            f"search{reserved} meets (ε = {epsilon:g}, δ = {delta:g}); its guarantee is ε = {spent:.4g}",
            flush=True,
        )
    accountant = PrivacyAccountantCallback(
        searcher,
        delta=delta,
        plan=plan,
        target_epsilon=None if ledger is not None else epsilon,
        search_epsilon=epsilon if ledger is not None else None,  # with a ledger, still this search's own cap
        generic=generic,
        ledger=ledger,
        dataset=dataset,
        verbose=verbose,
        audit=None if audit is None else audit.journal_record(),
        reserved_reruns=retries,
    )
    constants: dict[str, Any] = {NOISE_KEY: sigma}
    if own_loop:  # OpacusSpend(..., config=config) checks its loader against it before the first step
        constants[SEARCH_PLAN_KEY] = json.dumps(plan.to_dict())
    return tune.Tuner(
        trainable,
        param_space={**param_space, **constants},
        tune_config=tuning,
        run_config=_run_config(run_config, accountant),
    )


@dataclasses.dataclass(frozen=True)
class _SubsampledSearch:
    searcher: SubsampledTuningSearcher
    tuning_plan: TrialSpend
    final_noise_multiplier: float


def _subsampled_search(
    trainable: Any,
    param_space: dict[str, Any],
    *,
    law: RunCountDistribution | None,
    searcher: Any,
    plan_for: Any,
    audit: Any,
    tuning_fraction: float,
    final_noise_overhead: float,
    epsilon: float,
    delta: float,
    retries: int,
    generic: bool,
    metric: str | None,
    mode: str | None,
) -> _SubsampledSearch:
    """The subsampled tuning's searcher, its budget split into σ_T and σ_B (calibrate_subsampled_tuning)."""
    if law is None or searcher is not None:
        raise ValueError(
            "tuning_fraction= tunes by a random count on the sample: give law= (e.g. Poisson(mean=8)), not searcher=."
        )
    if audit is not None:
        raise ValueError("A canary audit covers a search over the whole training set, not a tuning on a sample.")
    fraction = validate.in_range("tuning_fraction", tuning_fraction, 0.0, 1.0, open_left=True, open_right=True)
    for key in (NOISE_KEY, SAMPLE_KEY):
        if key in param_space:
            raise ValueError(f"param_space must not set {key!r}: private_tuner sets it.")
    if plan_for is not None:  # a loop of your own: its loader comes from tuning_loader, planned by opacus_plan
        from ray_dptune.training.opacus_spend import OpacusPlan  # imported here: it needs torch and Opacus

        if not isinstance(plan_for, OpacusPlan):
            raise ValueError(
                "tuning_fraction= with a loop of your own plans it with plan_for=ray_dptune.training.opacus_plan(...) "
                "(the trials on the sample take their loader from ray_dptune.training.tuning_loader)."
            )
        tuning_plan: Callable[[float], TrialSpend] = plan_for.on_sample(fraction)
        planned: Callable[[float], TrialSpend] = plan_for
    elif hasattr(trainable, "privacy_plan") and hasattr(trainable, "dataset_size"):
        size = trainable.dataset_size(param_space)
        sample_size = planned_sample_size(fraction, size)

        def tuning_plan(sigma: float) -> TrialSpend:
            plan: TrialSpend = trainable.privacy_plan({**param_space, NOISE_KEY: sigma}, dataset_size=sample_size)
            return plan

        def planned(sigma: float) -> TrialSpend:
            plan: TrialSpend = trainable.privacy_plan({**param_space, NOISE_KEY: sigma}, dataset_size=size)
            return plan

    else:
        raise TypeError(
            f"trainable {type(trainable).__name__} is not a ray_dptune.training.dp_trainable: pass "
            "plan_for=ray_dptune.training.opacus_plan(...) for a loop of your own."
        )

    def final_plan(sigma: float) -> TrialSpend:
        plan = planned(sigma)
        if plan.score_releases:
            raise ValueError(
                "tuning_fraction= releases the final run's model only: score on a public validation set "
                "(score_noise_multiplier=None)."
            )
        return plan

    sigma_tuning, sigma_final = calibrate_subsampled_tuning(
        tuning_plan,
        final_plan,
        epsilon=epsilon,
        delta=delta,
        law=law,
        sample_rate=fraction,
        final_noise_overhead=final_noise_overhead,
        retries=retries,
        generic=generic,
    )
    searcher = SubsampledTuningSearcher(
        law,
        tuning_fraction=fraction,
        final_plan=final_plan(sigma_final),
        final_noise_multiplier=sigma_final,
        metric=metric,
        mode=mode,
    )
    return _SubsampledSearch(searcher, tuning_plan(sigma_tuning), sigma_final)


def _check_budget(epsilon: float, delta: float) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0 (the whole search's budget), got {epsilon!r}.")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must lie strictly between 0 and 1, got {delta!r}.")


def _check_reported_metric(trainable: Any, metric: str | None) -> None:
    """Refuses a metric other than the one a ``dp_trainable`` reports its score under.

    The trainable reports one score under a name fixed when it was built: a search selecting on another
    name would fail at the first report, after a trial trained; refused here instead.
    """
    reported = getattr(getattr(trainable, "spec", None), "metric", None)
    if metric is not None and isinstance(reported, str) and metric != reported:
        raise ValueError(
            f"metric={metric!r}, but the trainable reports its validation accuracy as {reported!r} "
            f"(dp_trainable(..., metric={reported!r})): select on metric={reported!r}, or build the trainable with "
            f"metric={metric!r}."
        )


def _max_failures(run_config: tune.RunConfig | None) -> int:
    failure = None if run_config is None else run_config.failure_config
    return 0 if failure is None else failure.max_failures


def _reserved_retries(retries: int | None, max_failures: int, mechanism: Any) -> int:
    """The re-runs the budget reserves: ``retries``, else Tune's ``max_failures``.

    0 for a halving search, which pays every attempt from its budget of time units.
    """
    if mechanism.pays_by_units:
        mechanism.check_reserved_reruns(retries or 0)
        return 0
    if retries is not None:
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"retries must be an int >= 0 (re-runs the budget reserves), got {retries!r}.")
        needed = mechanism.retry_reserve(max_failures) or 0
        if retries < needed:
            raise ValueError(
                f"retries={retries} reserves fewer re-runs than FailureConfig(max_failures={max_failures}) may charge "
                f"({needed}): the stated guarantee must cover every retry the search allows. Give retries >= {needed}."
            )
        return retries
    if max_failures < 0:
        raise ValueError(
            "FailureConfig(max_failures=-1) retries without limit, which no finite budget pays for: pass "
            "private_tuner(..., retries=R), the re-runs the whole search may pay for (each composed at the plan)."
        )
    return max_failures


def _selection_rule(
    metric: str | None, mode: str | None, given: tune.TuneConfig | None
) -> tuple[str | None, str | None]:
    """``metric`` and ``mode``, else those of the user's TuneConfig (which give them to the searcher)."""
    chosen = []
    for name, value in (("metric", metric), ("mode", mode)):
        configured = None if given is None else getattr(given, name)
        if value is not None and configured not in (None, value):
            raise ValueError(f"{name}={value!r} differs from tune_config.{name}={configured!r}: set it once.")
        chosen.append(value if value is not None else configured)
    return chosen[0], chosen[1]


def _searcher(law: RunCountDistribution | None, searcher: Any, metric: str | None, mode: str | None) -> PrivateSearcher:
    if (law is None) == (searcher is None):
        raise ValueError("Give exactly one of law= (a random-count search) and searcher= (any DP searcher).")
    if searcher is None:
        assert law is not None  # exactly one of them is given
        return RandomCountSearcher(law, metric=metric, mode=mode)
    own = private_searcher_of(searcher)
    for name, value in (("metric", metric), ("mode", mode)):
        if value is not None and getattr(own, name) not in (None, value):
            raise ValueError(f"{name}={value!r} differs from the searcher's {getattr(own, name)!r}: set it once.")
    return own


def _plan_factory(
    trainable: Any, param_space: dict[str, Any], searcher: PrivateSearcher
) -> Callable[[float], TrialSpend]:
    """σ → the plan covering every trial the searcher may run (:meth:`PrivateSearcher.planned_spaces`)."""
    spaces = searcher.planned_spaces(param_space)
    size = trainable.dataset_size(param_space)

    def plan_for(sigma: float) -> TrialSpend:
        plans: list[TrialSpend] = [
            trainable.privacy_plan({**space, NOISE_KEY: sigma}, dataset_size=size) for space in spaces
        ]
        covering = [plan for plan in plans if all(plan.covers(other) for other in plans)]
        if not covering:
            raise ValueError(
                "The candidates' privacy parameters differ so that no one plan covers them all; give them the "
                "same batch_size and epochs."
            )
        return covering[0]

    return plan_for


def _tune_config(
    search_alg: Any, given: tune.TuneConfig | None, *, metric: str | None, mode: str | None
) -> tune.TuneConfig:
    """The user's TuneConfig, with the private search's searcher, guard and ``num_samples=-1``."""
    selection = {key: value for key, value in (("metric", metric), ("mode", mode)) if value is not None}
    if given is None:
        return private_tune_config(search_alg, **selection)
    if given.search_alg is not None:
        raise ValueError("Pass the DP searcher as private_tuner(searcher=...), not in tune_config.search_alg.")
    if given.num_samples not in (1, -1):  # 1 is TuneConfig's default
        raise PrivacyError(
            f"tune_config.num_samples={given.num_samples} would cap the number of trials; a DP searcher draws it "
            "at random and ends the search itself."
        )
    rest = {
        field.name: getattr(given, field.name)
        for field in dataclasses.fields(given)
        if field.name not in _SEARCHER_OWNED and field.init
    }
    return private_tune_config(search_alg, **rest, **selection)


def _run_config(given: tune.RunConfig | None, accountant: PrivacyAccountantCallback) -> tune.RunConfig:
    given = given or tune.RunConfig()
    return dataclasses.replace(given, callbacks=[*(given.callbacks or []), accountant])
