"""``config["dp_tuning_sample"]``: train on the secret Poisson sample a subsampled tuning runs on.

Every record of the training set is in the sample independently with probability p (the
fraction), decided by a coin per position drawn from a secret 128-bit seed the searcher put
into every tuning trial's config: one sample for the whole tuning, the same in every trial,
worker and process, provided ``data_fn`` returns the training set in the same order each time.
Coins per position (not a hash of the content) keep duplicates independent, as Poisson
sampling requires (Balle, Barthe & Gaboardi 2018, Thm 8).

DP-SGD on the sample samples at q = batch_size / :meth:`TuningSample.planned_size`, a size
fixed from public quantities (p·n), never from the realised sample. The seed is the
operator's secret: it names every record's membership, so the privacy report withholds it
and the final run's config (the released one) does not carry it.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ray_dptune import validate
from ray_dptune.result_keys import SAMPLE_KEY

__all__ = ["TuningSample", "planned_sample_size", "tuning_sample_indices"]

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True, repr=False)
class TuningSample:
    """The secret Poisson sample of rate ``fraction`` a subsampled tuning's trials train on.

    Attributes:
        seed: 128 bits, hexadecimal (secret: it decides every record's membership).
        fraction: p in (0, 1), each record's chance to be in the sample.
    """

    seed: str
    fraction: float

    def __post_init__(self) -> None:
        hexadecimal = isinstance(self.seed, str) and bool(self.seed) and all(c in _HEX for c in self.seed.lower())
        if not hexadecimal:
            raise ValueError(f"config[{SAMPLE_KEY!r}]['seed'] must be a hexadecimal string (the sample's secret seed).")
        fraction = validate.in_range(f"config[{SAMPLE_KEY!r}]['fraction']", self.fraction, 0.0, 1.0)
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"config[{SAMPLE_KEY!r}]['fraction'] must lie strictly between 0 and 1, got {fraction}.")

    def __repr__(self) -> str:
        return f"TuningSample(seed=<secret>, fraction={self.fraction})"

    @classmethod
    def draw(cls, fraction: float, *, rng: np.random.Generator | None = None) -> TuningSample:
        """A new sample's seed: from the OS's secure source, or from ``rng`` (tests, reproducibility)."""
        bits = secrets.randbits(128) if rng is None else int.from_bytes(rng.bytes(16), "big")
        return cls(f"{bits:032x}", float(fraction))

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TuningSample | None:
        """The sample ``config`` trains on; None for a trial on all the data."""
        value = config.get(SAMPLE_KEY)
        if value is None:
            return None
        if not isinstance(value, Mapping) or set(value) != {"seed", "fraction"}:
            raise ValueError(f"config[{SAMPLE_KEY!r}] must be {{'seed': hex, 'fraction': p}}, got {value!r}.")
        return cls(value["seed"], value["fraction"])

    def to_config(self) -> dict[str, Any]:
        """The value of ``config["dp_tuning_sample"]``."""
        return {"seed": self.seed, "fraction": self.fraction}

    def planned_size(self, dataset_size: int) -> int:
        """The public size DP-SGD's plan samples from on the sample (:func:`planned_sample_size`)."""
        return planned_sample_size(self.fraction, dataset_size)

    def indices(self, dataset_size: int) -> np.ndarray:
        """Positions of the training set's records in the sample (one independent coin each)."""
        dataset_size = validate.integer("dataset_size", dataset_size, minimum=0)
        coins = np.random.default_rng(int(self.seed, 16)).random(dataset_size)
        return np.flatnonzero(coins < self.fraction)


def planned_sample_size(fraction: float, dataset_size: int) -> int:
    """The public size DP-SGD's plan samples from on a sample of rate ``fraction``: max(1, ⌊p·n⌉), from n alone."""
    dataset_size = validate.integer("dataset_size", dataset_size, minimum=1)
    return max(1, round(fraction * dataset_size))


def tuning_sample_indices(config: Mapping[str, Any], dataset_size: int) -> tuple[np.ndarray, int] | None:
    """For a loop of your own: (positions of the sample's records, the size to plan DP-SGD on), or None.

    None for the final run, which trains on all the data. A tuning trial trains on
    ``torch.utils.data.Subset(train_set, indices)`` at q = batch_size / planned size.
    """
    sample = TuningSample.from_config(config)
    if sample is None:
        return None
    return sample.indices(dataset_size), sample.planned_size(dataset_size)
