"""``config["dp_partition"]``: train on one of k disjoint parts of the training set.

Subsample-and-aggregate tuning (Ding et al., "Constant-overhead Differentially Private
Hyperparameter Tuning", Alg. 1 line 1) trains one model per part and needs each
example to influence one part only: then adding or removing an example changes one
model, and the mean of the k utilities moves by at most 1/k (their Lemma 2 on its
sensitivity). A split that depends on n (e.g. a permutation of range(n)) breaks this:
one more example reshuffles every part. So each example's part is a keyed hash of
its own content (input and target bytes), mod k: deterministic in every trial, worker
and process, disjoint, covering, and stable under adding or removing other examples.
Parts are near k-equal (multinomial sizes), and duplicates share a part.

The items of the data set must be deterministic (no random augmentation in
``__getitem__``); a part's DP-SGD plan samples at q = batch_size / (its size).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sized
from dataclasses import dataclass
from numbers import Integral
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ray_dptune.result_keys import PARTITION_KEY

__all__ = ["Partition", "part_sizes", "partition_indices"]


_HASH_KEY = b"ray_dptune.partition.v1"  # changing it changes every assignment


@dataclass(frozen=True)
class Partition:
    """Part ``index`` of ``count``; ``private=False`` trains it without DP (plain SGD).

    Attributes:
        index: i in [0, count).
        count: k >= 1.
        private: False for Ding et al.'s non-private per-part training, whose utilities
            their sparse vector technique protects; the trial then reports no plan.
    """

    index: int
    count: int
    private: bool = True

    def __post_init__(self) -> None:
        integers = all(isinstance(v, Integral) and not isinstance(v, bool) for v in (self.index, self.count))
        if not (integers and 0 <= self.index < self.count and isinstance(self.private, bool)):
            raise ValueError(
                f"config['{PARTITION_KEY}'] needs integers 0 <= index < count and private True or False, "
                f"got index={self.index!r}, count={self.count!r}, private={self.private!r}."
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Partition | None:
        """The config's partition, or None for the whole training set.

        Raises:
            ValueError: not a dict of ``index``, ``count`` and optionally ``private``, or out of range.
        """
        value = config.get(PARTITION_KEY)
        if value is None:
            return None
        if not isinstance(value, Mapping) or not {"index", "count"} <= value.keys() <= {"index", "count", "private"}:
            raise ValueError(
                f"config['{PARTITION_KEY}'] must be a dict {{'index': i, 'count': k}} (optionally 'private': False), "
                f"got {value!r}."
            )
        return cls(**value)

    def subset(self, dataset: Dataset[Any]) -> Subset[Any]:
        """This part of ``dataset``, in the data set's order."""
        indices = np.flatnonzero(partition_indices(dataset, self.count) == self.index)
        return Subset(dataset, indices.tolist())


def partition_indices(dataset: Dataset[Any], count: int) -> np.ndarray:
    """The part (0 .. count-1) of every example of ``dataset``: a keyed BLAKE2b hash of its content, mod count.

    Raises:
        TypeError: an item is not a tuple or list of tensors, arrays or numbers.
    """
    parts = np.empty(len(cast(Sized, dataset)), dtype=np.int64)
    for position in range(len(cast(Sized, dataset))):
        digest = hashlib.blake2b(digest_size=8, key=_HASH_KEY)
        _hash_item(digest, dataset[position])
        parts[position] = int.from_bytes(digest.digest(), "little") % count
    return parts


def _hash_item(digest: Any, item: Any) -> None:
    """Feeds the dtype, shape and bytes of every tensor of an (input, target) item to ``digest``."""
    if isinstance(item, (tuple, list)):
        for value in item:
            _hash_item(digest, value)
        return
    if not isinstance(item, (torch.Tensor, np.ndarray, np.generic, int, float)):
        raise TypeError(
            f"config['{PARTITION_KEY}'] assigns examples by their content, which must be tensors, arrays or "
            f"numbers (in tuples or lists); got {type(item).__name__}. Convert the items in data_fn's data set."
        )
    array = torch.as_tensor(item).detach().cpu().contiguous().numpy()
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())


def part_sizes(dataset: Dataset[Any], count: int) -> np.ndarray:
    """The number of examples of ``dataset`` in each of ``count`` parts."""
    return np.bincount(partition_indices(dataset, count), minlength=count)
