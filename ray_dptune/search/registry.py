"""The DP searchers ray_dptune offers: one table, read by the exports, the error messages and the contract tests.

No Ray import: the package's lazy exports read it. Adding a searcher means its module,
one line here and one case in ``tests/search/test_searcher_contract.py``.
"""

from __future__ import annotations

__all__ = ["SEARCHERS", "searcher_names"]

SEARCHERS: dict[str, str] = {
    "RandomCountSearcher": "ray_dptune.search.random_count",
    "DPHyPOSearcher": "ray_dptune.search.dphypo",
    "ConstantOverheadSearcher": "ray_dptune.search.constant_overhead",
    "DPBOSearcher": "ray_dptune.search.dpbo",
    "HalvingSearcher": "ray_dptune.search.halving",
    "SubsampledTuningSearcher": "ray_dptune.search.subsampled",
}
"""Class name -> the module that defines it. ``HalvingSearcher`` is built by ``PrivateASHAScheduler``."""


def searcher_names() -> str:
    """The searchers, for an error message."""
    return ", ".join(SEARCHERS)
