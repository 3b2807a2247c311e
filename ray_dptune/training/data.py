"""Ready-made private data for examples and tests: scikit-learn's handwritten digits.

scikit-learn ships the data (1 797 grey-scale 8×8 images, 10 classes), so nothing is
downloaded at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from ray_dptune.extras import extra_imports

__all__ = ["DIGITS_SPLIT_SEED", "DIGITS_VAL_FRACTION", "digits_data"]

DIGITS_VAL_FRACTION = 0.2
"""Share of the images held out for validation: 1 437 train / 360 validation images."""

DIGITS_SPLIT_SEED = 0
"""Seed of the stratified train/validation split, fixed so that every trial sees the same split."""


def digits_data(config: Mapping[str, Any] | None = None) -> tuple[TensorDataset, TensorDataset]:
    """The digits data set as (train, validation) tensor data sets.

    Inputs are float32 tensors of shape ``1 x 8 x 8`` scaled to [0, 1] (pixel / 16),
    targets int64 class labels. The split is stratified and deterministic
    (``sklearn.model_selection.train_test_split`` with ``DIGITS_SPLIT_SEED``).

    Args:
        config: the trial's config; unused, accepted so that this is a ``data_fn``
            for :func:`ray_dptune.training.dp_trainable`.

    Returns:
        (train, validation): 1 437 and 360 (image, label) pairs.
    """
    del config  # the data do not depend on hyperparameters
    with extra_imports("examples", "ray_dptune.training.digits_data"):  # imported here: scikit-learn takes ~1 s
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

    digits = load_digits()
    train_x, val_x, train_y, val_y = train_test_split(
        digits.images,
        digits.target,
        test_size=DIGITS_VAL_FRACTION,
        random_state=DIGITS_SPLIT_SEED,
        stratify=digits.target,
    )
    return _tensor_dataset(train_x, train_y), _tensor_dataset(val_x, val_y)


def _tensor_dataset(images: np.ndarray, labels: np.ndarray) -> TensorDataset:
    inputs = torch.as_tensor(images / 16.0, dtype=torch.float32).unsqueeze(1)
    return TensorDataset(inputs, torch.as_tensor(labels, dtype=torch.int64))
