"""``config["dp_tuning_sample"]``: train on the secret Poisson sample a subsampled tuning runs on.

Every record of the training set is in the sample independently with probability p (the
fraction), decided by a coin per position drawn from a secret 128-bit seed: one sample for the
whole tuning, the same in every trial, worker and process, provided ``data_fn`` returns the
training set in the same order each time. Coins per position (not a hash of the content) keep
duplicates independent, as Poisson sampling requires (Balle, Barthe & Gaboardi 2018, Thm 8).

The seed names every record's membership, and a known seed undoes the amplification, so it
never enters a trial's config (which Ray writes into folder names, logs and result files): the
config holds the fraction and a random ``sample_id``, and a trial reads the seed from the
driver's keeper, a named Ray actor (:meth:`TuningSample.keep`, :meth:`TuningSample.from_config`),
or from this process when the searcher runs in it.

DP-SGD on the sample samples at q = batch_size / :func:`planned_sample_size`, a size fixed from
public quantities (p·n), never from the realised sample.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ray_dptune import validate
from ray_dptune.errors import PrivacyError, RefusedBeforeTraining
from ray_dptune.result_keys import SAMPLE_KEY

__all__ = ["TuningSample", "planned_sample_size", "sample_fraction", "tuning_sample_indices"]

_KEPT: dict[str, int] = {}
"""sample_id -> seed, for the samples a searcher in this process keeps."""
_HANDLES: dict[tuple[str, str, str], Any] = {}
"""(sample_id, Ray job, node) -> its keeper actor's handle, while this driver keeps it."""


@dataclass(frozen=True, repr=False)
class TuningSample:
    """The secret Poisson sample of rate ``fraction`` a subsampled tuning's trials train on.

    Attributes:
        seed: 128 random bits (secret: they decide every record's membership).
        fraction: p in (0, 1), each record's chance to be in the sample.
        sample_id: a random name for the sample, unrelated to the seed (what configs carry).
    """

    seed: int
    fraction: float
    sample_id: str = field(default_factory=lambda: secrets.token_hex(8))

    def __post_init__(self) -> None:
        validate.integer("seed", self.seed)
        fraction = validate.in_range(f"config[{SAMPLE_KEY!r}]['fraction']", self.fraction, 0.0, 1.0)
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"config[{SAMPLE_KEY!r}]['fraction'] must lie strictly between 0 and 1, got {fraction}.")

    def __repr__(self) -> str:
        return f"TuningSample(seed=<secret>, fraction={self.fraction}, sample_id={self.sample_id!r})"

    @classmethod
    def draw(cls, fraction: float, *, rng: np.random.Generator | None = None) -> TuningSample:
        """A new sample's seed: from the OS's secure source, or from ``rng`` (tests, reproducibility)."""
        seed = secrets.randbits(128) if rng is None else int.from_bytes(rng.bytes(16), "big")
        return cls(seed, float(fraction))

    def keep(self) -> None:
        """Makes the seed readable by this search's trials: in this process, and from a named Ray actor.

        The actor lives as long as this driver; a restored search keeps its sample again. Idempotent.
        """
        _KEPT[self.sample_id] = self.seed
        import ray  # imported here: only a driver with Ray running needs the actor

        if not ray.is_initialized():
            return
        context = ray.get_runtime_context()
        job = (self.sample_id, context.get_job_id(), context.get_node_id())  # a new cluster: a new keeper
        if job not in _HANDLES:
            handle = _keeper().options(name=_keeper_name(self.sample_id), get_if_exists=True).remote(self.seed)
            if ray.get(handle.seed.remote()) != self.seed:  # created and named before any trial looks it up
                raise PrivacyError(f"A keeper of sample {self.sample_id} holds another seed: refusing to train on it.")
            _HANDLES[job] = handle  # held: Ray collects an actor no handle refers to

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TuningSample | None:
        """The sample ``config`` trains on, its seed read from the driver's keeper; None for a trial on all the data.

        Raises:
            RefusedBeforeTraining: the keeper is gone (its driver ended): no record was read.
            ValueError: a malformed ``config["dp_tuning_sample"]``.
        """
        fraction = sample_fraction(config)
        if fraction is None:
            return None
        sample_id = config[SAMPLE_KEY]["sample_id"]
        seed = _KEPT.get(sample_id)
        if seed is None:
            seed = _seed_from_keeper(sample_id)
        return cls(seed, fraction, sample_id)

    def to_config(self) -> dict[str, Any]:
        """The value of ``config["dp_tuning_sample"]``: the fraction and the sample's id, never its seed."""
        return {"sample_id": self.sample_id, "fraction": self.fraction}

    def planned_size(self, dataset_size: int) -> int:
        """The public size DP-SGD's plan samples from on the sample (:func:`planned_sample_size`)."""
        return planned_sample_size(self.fraction, dataset_size)

    def indices(self, dataset_size: int) -> np.ndarray:
        """Positions of the training set's records in the sample (one independent coin each)."""
        dataset_size = validate.integer("dataset_size", dataset_size, minimum=0)
        coins = np.random.default_rng(self.seed).random(dataset_size)
        return np.flatnonzero(coins < self.fraction)


def sample_fraction(config: Mapping[str, Any]) -> float | None:
    """P of the tuning sample ``config`` trains on (no seed needed: enough to plan); None for all the data."""
    value = config.get(SAMPLE_KEY)
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != {"sample_id", "fraction"}:
        raise ValueError(f"config[{SAMPLE_KEY!r}] must be {{'sample_id': str, 'fraction': p}}, got {value!r}.")
    fraction = validate.in_range(f"config[{SAMPLE_KEY!r}]['fraction']", value["fraction"], 0.0, 1.0)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"config[{SAMPLE_KEY!r}]['fraction'] must lie strictly between 0 and 1, got {fraction}.")
    return fraction


def planned_sample_size(fraction: float, dataset_size: int) -> int:
    """The public size DP-SGD's plan samples from on a sample of rate ``fraction``: max(1, ⌊p·n⌉), from n alone."""
    dataset_size = validate.integer("dataset_size", dataset_size, minimum=1)
    return max(1, round(fraction * dataset_size))


def tuning_sample_indices(config: Mapping[str, Any], dataset_size: int) -> tuple[np.ndarray, int] | None:
    """For a loop of your own: (positions of the sample's records, the size to plan DP-SGD on), or None.

    None for the final run, which trains on all the data. A tuning trial trains on
    ``torch.utils.data.Subset(train_set, indices)`` at q = batch_size / planned size
    (:func:`ray_dptune.training.tuning_loader` builds that loader).
    """
    sample = TuningSample.from_config(config)
    if sample is None:
        return None
    return sample.indices(dataset_size), sample.planned_size(dataset_size)


def _keeper_name(sample_id: str) -> str:
    return f"ray_dptune_tuning_sample_{sample_id}"


@functools.cache
def _keeper() -> Any:
    """The keeper actor class (built once, with Ray imported)."""
    import ray

    @ray.remote(num_cpus=0)
    class SampleKeeper:
        """Holds one tuning sample's seed for the trials of its driver's search."""

        def __init__(self, seed: int) -> None:
            self._seed = seed

        def seed(self) -> int:
            return self._seed

    return SampleKeeper


def _seed_from_keeper(sample_id: str) -> int:
    import ray

    try:
        keeper = ray.get_actor(_keeper_name(sample_id)) if ray.is_initialized() else None
    except ValueError:
        keeper = None
    if keeper is None:
        raise RefusedBeforeTraining(
            f"The tuning sample {sample_id}'s seed is not kept by any live driver (its search ended, or this trial runs "
            "outside it): the trial is refused before reading any record. Resume the search with tune.Tuner.restore."
        )
    seed: int = ray.get(keeper.seed.remote())
    return seed
