"""Exceptions raised by ray_dptune."""


class PrivacyError(RuntimeError):
    """The requested run would make the reported privacy guarantee wrong.

    Raised instead of a warning wherever continuing would report an ε lower than
    the truth: a trial spending above its plan, a truncated number of runs, an
    adaptive scheduler under a DP searcher, a combination no theorem covers.
    """


class UnsupportedBoundError(PrivacyError, ValueError):
    """No proven privacy bound covers this combination of inputs.

    Subclasses both :class:`PrivacyError` and :class:`ValueError`, so callers that
    validate arguments and callers that guard privacy can each catch it.
    """


class BudgetExceededError(PrivacyError):
    """A step of the search would take its guarantee past the ε the user set as its budget.

    Raised before the step runs (the write-ahead charge is refused), so the budget is
    never crossed by anything the search controls.
    """


class RefusedBeforeTraining(PrivacyError):
    """A trial stopped itself before its first training step, on public facts alone (its plan, its loader).

    Raised in the trial (e.g. by :class:`~ray_dptune.training.OpacusSpend` when the loader's
    sampling rate, the steps or σ do not fit the search's plan). The accountant then stops the
    search; when every attempt of the search was refused so, it touched no data and its account is ε = 0.
    Raising it is a claim the account trusts, like the claim that a trainable touches the data only
    through its DP optimizer: raise it only before anything has read the private data.
    """
