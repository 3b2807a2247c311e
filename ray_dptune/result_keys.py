"""The ``dp_*`` keys that trials, schedulers and the accountant share: one home for each.

A trial's ``tune.report`` carries :data:`PLAN_KEY` and :data:`SPENT_KEY`; the accountant adds
:data:`EPSILON_KEY` to every accounted result; a partitioned trial reads :data:`PARTITION_KEY`
from its config, a trainable of the user's own :data:`SEARCH_PLAN_KEY`, a subsampled tuning's trial
:data:`SAMPLE_KEY`. No Ray, no torch.
"""

__all__ = [
    "AUDIT_KEY",
    "EPSILON_KEY",
    "NOISE_KEY",
    "PARTITION_KEY",
    "PLAN_KEY",
    "PRIVATE_KEY",
    "SAMPLE_KEY",
    "SEARCH_PLAN_KEY",
    "SPENT_KEY",
]

PLAN_KEY = "dp_plan"
"""The most the trial will spend (a :class:`~ray_dptune.accounting.bookkeeping.spend.TrialSpend` dict), fixed before training."""

SPENT_KEY = "dp_spent"
"""What the trial has spent so far; this report's score included."""

NOISE_KEY = "noise_multiplier"
"""Config key of DP-SGD's σ: :func:`~ray_dptune.private_tuner` sets it, every trainable reads it (a
:class:`~ray_dptune.training.plan.PrivacyParams` field of the same name)."""

SEARCH_PLAN_KEY = "dp_search_plan"
"""Config key :func:`~ray_dptune.private_tuner` sets for a trainable of its own: the plan every trial must fit (a
:class:`~ray_dptune.accounting.bookkeeping.spend.TrialSpend` dict as JSON), which ``OpacusSpend(..., config=config)`` checks
before the first training step."""

PRIVATE_KEY = "dp_private"
"""``False`` in the reports of a non-private partition trial (trained on public data), which carry no plan."""

EPSILON_KEY = "dp_search_epsilon"
"""Added to every accounted result: the whole search's ε so far (Tune's loggers, TensorBoard, MLflow, W&B see it)."""

PARTITION_KEY = "dp_partition"
"""Config key of a partition trial: ``{"index": i, "count": k}``, optionally with ``"private": False``."""

AUDIT_KEY = "dp_audit"
"""In an audited trial's last report: its canary counts (an :class:`~ray_dptune.audit.counts.AuditCounts` dict)."""

SAMPLE_KEY = "dp_tuning_sample"
"""Config key of a subsampled tuning's trial: ``{"sample_id": str, "fraction": p}``, the secret Poisson sample it trains
on (:class:`~ray_dptune.tuning_sample.TuningSample`; the seed is never in a config); absent in the final run."""
