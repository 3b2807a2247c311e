"""The search's records, storage only: the write-ahead journal, the dataset ledger, the report.

Nothing here computes a guarantee: each record is read back into
:class:`~ray_dptune.accounting.bookkeeping.account.SearchAccount`, the one place that does. No Ray, no torch.
"""
