"""An empirical lower bound on ε beside the proven upper bound, from one run of the whole search.

Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023):
canaries each inserted with probability ½
(:class:`ray_dptune.training.CanaryAudit`), membership guesses on
the released model (:class:`AuditCounts`), and Theorem 3's test
(:func:`one_run_epsilon_lower`). A lower bound far below the proven ε is expected for a
black-box audit; one above it is a bug.
"""

from ray_dptune.audit.bound import DEFAULT_CONFIDENCE, one_run_epsilon_lower, one_run_p_value
from ray_dptune.audit.counts import AUDIT_METHODS, BLACK_BOX_LOSS, WHITE_BOX_GRADIENT, AuditCounts
from ray_dptune.audit.result import released_audit

__all__ = [
    "AUDIT_METHODS",
    "BLACK_BOX_LOSS",
    "DEFAULT_CONFIDENCE",
    "WHITE_BOX_GRADIENT",
    "AuditCounts",
    "one_run_epsilon_lower",
    "one_run_p_value",
    "released_audit",
]
