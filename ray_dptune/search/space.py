"""Uniform, data-independent sampling of a Ray Tune search space.

Every Tune domain is drawn with Ray's own sampler (``Domain.sample``) from the
searcher's generator: uniform, loguniform, randint, choice and their quantized
forms keep exactly the law Tune documents. A ``grid_search`` is drawn uniformly
over its points; ``sample_from`` functions are resolved last, with the rest of
the configuration, as Tune does.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
from ray.tune.search.sample import Domain, Function
from ray.tune.search.variant_generator import assign_value, parse_spec_vars

__all__ = ["check_space", "sample_config", "space_fingerprint"]


def check_space(space: dict[str, Any]) -> None:
    """Raises TypeError for a space that is not a dict of Tune domains and constants."""
    if not isinstance(space, dict):
        raise TypeError(f"The search space must be a dict (Tune's param_space), got {type(space).__name__}.")
    parse_spec_vars(space)


def sample_config(space: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """One configuration drawn from ``space`` with ``rng`` (independent of any data)."""
    _, domain_vars, grid_vars = parse_spec_vars(space)
    config = copy.deepcopy(space)
    for path, grid in grid_vars:
        assign_value(config, path, grid.categories[int(rng.integers(len(grid.categories)))])
    functions = []
    for path, domain in domain_vars:
        if isinstance(domain, Function):
            functions.append((path, domain))
        else:
            assign_value(config, path, _plain(domain.sample(random_state=rng)))
    for path, domain in functions:
        assign_value(config, path, _plain(domain.sample(config=config, random_state=rng)))
    return config


def _plain(value: Any) -> Any:
    """Numpy scalars as Python numbers, so configs serialise cleanly."""
    return value.item() if isinstance(value, np.generic) else value


def is_domain(value: Any) -> bool:
    """True for a Tune domain (``tune.uniform(...)`` and friends)."""
    return isinstance(value, Domain)


def space_fingerprint(space: Any) -> str:
    """A canonical text of a Tune space (domains with their bounds and samplers), for equality checks."""
    return json.dumps(_describe(space), sort_keys=True, default=repr)


def _describe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _describe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_describe(item) for item in value]
    if callable(value) and not hasattr(value, "__dict__"):
        return getattr(value, "__qualname__", repr(value))
    if hasattr(value, "__dict__") and not isinstance(value, type):
        fields = {key: _describe(item) for key, item in vars(value).items() if not key.startswith("__")}
        return {"type": type(value).__name__, **fields} if not callable(value) else getattr(value, "__qualname__", repr(value))
    return value
