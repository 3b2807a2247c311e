"""The optional dependencies: which pip extra installs what, and the error when one is missing.

``pip install ray_dptune`` installs the core (numpy, SciPy, dp-accounting, Ray Tune): the
accounting, the records, the Tune integration, the random-count, constant-overhead and
private-ASHA searchers, and the ``ray-dptune`` command. The rest is fenced off by extra, as
pyproject.toml's ``[project.optional-dependencies]`` declares:

============  =====================  ==============================================
extra         packages               needed by
============  =====================  ==============================================
``train``     torch, Opacus          :mod:`ray_dptune.training` (DP-SGD trials)
``dphypo``    BoTorch, GPyTorch      ``DPHyPOSearcher`` and ``DPBOSearcher`` (GPs)
``plot``      matplotlib             ``ray-dptune plan --plot``
``examples``  scikit-learn           ``training.digits_data`` and ``examples/``
============  =====================  ==============================================

A module that needs an extra fences its imports with :func:`extra_imports`, or, when it
imports the packages only later (to keep its own import cheap), calls :func:`require_extra`
at import time, so the error comes before a search starts rather than in its middle.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Literal

__all__ = ["EXTRAS", "Extra", "MissingExtraError", "extra_imports", "missing_extra", "require_extra"]

Extra = Literal["train", "dphypo", "plot", "examples"]

EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (("torch", "torch"), ("opacus", "Opacus")),
    "dphypo": (("botorch", "BoTorch"), ("gpytorch", "GPyTorch")),
    "plot": (("matplotlib", "matplotlib"),),
    "examples": (("sklearn", "scikit-learn"),),
}
"""extra -> (import name, distribution name) of each package the code checks for."""


class MissingExtraError(ImportError):
    """An optional package is missing; the message names the extra that installs it."""


def missing_extra(extra: Extra, user: str, *, name: str | None = None) -> MissingExtraError:
    """The error saying that ``user`` needs the packages of ``extra`` and how to install them.

    >>> str(missing_extra("train", "ray_dptune.training"))
    "ray_dptune.training needs torch and Opacus: pip install 'ray_dptune[train]'"

    Args:
        extra: the extra of pyproject.toml that installs them.
        user: what needs them (a module, a class or a command), as the user knows it.
        name: the import name found missing, kept as ``ImportError.name``.
    """
    packages = [label for _, label in EXTRAS[extra]]
    listed = " and ".join([", ".join(packages[:-1]), packages[-1]] if len(packages) > 1 else packages)
    return MissingExtraError(f"{user} needs {listed}: pip install 'ray_dptune[{extra}]'", name=name)


@contextlib.contextmanager
def extra_imports(extra: Extra, user: str) -> Iterator[None]:
    """Turns an ImportError raised inside into :func:`missing_extra`'s, chained from the original.

    >>> with extra_imports("plot", "ray-dptune plan --plot"):
    ...     from matplotlib.figure import Figure
    """
    try:
        yield
    except ImportError as error:
        raise missing_extra(extra, user, name=error.name) from error


def require_extra(extra: Extra, user: str) -> None:
    """Raises :func:`missing_extra`'s error unless every package of ``extra`` can be found.

    Imports none of them (``importlib.util.find_spec`` on the top-level names), so a module
    can check at import time and still import torch only when it first needs it.
    """
    for module, _ in EXTRAS[extra]:
        try:
            if importlib.util.find_spec(module) is not None:
                continue
            cause: ImportError = ModuleNotFoundError(f"No module named {module!r}", name=module)
        except ImportError as error:  # a finder that refuses the name outright
            cause = error
        raise missing_extra(extra, user, name=module) from cause
