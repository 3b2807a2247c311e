"""Gaussian-process helpers of the adaptive searchers: a fixed-hyperparameter posterior and thread control."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from ray_dptune.accounting.bounds.information_gain import KernelName
from ray_dptune.extras import extra_imports

__all__ = ["gp_posterior", "single_thread"]


@contextlib.contextmanager
def single_thread(torch: Any) -> Iterator[None]:
    """Small GP algebra runs fastest on one thread (and 10× slower when a busy machine's threads contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def gp_posterior(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    *,
    kernel: KernelName,
    lengthscale: float,
    noise_variance: float,
) -> tuple[np.ndarray, np.ndarray]:
    """μ_t and σ_t of GP(0, k2) + N(0, σ²) noise (Kusner eq. 2) with fixed hyperparameters.

    A BoTorch ``SingleTaskGP`` with a zero mean, a k2(λ, λ) = 1 kernel of fixed
    lengthscale, the fixed noise σ², no outcome or input transform and every
    parameter frozen; exact Cholesky algebra in float64 (no CG or fast variances).

    Args:
        train_x: (t, k) observed inputs.
        train_y: (t,) observations.
        test_x: (n, k) inputs to predict at.
        kernel: "rbf" or "matern52" (Matérn-5/2), as in
            :func:`~ray_dptune.accounting.bounds.information_gain.kernel_matrix`.
        lengthscale: ℓ > 0, fixed.
        noise_variance: σ² > 0, the fixed observation noise.

    Returns:
        (mean, std), two (n,) arrays.
    """
    test_x = np.asarray(test_x, dtype=float)
    if len(train_y) == 0:
        return np.zeros(test_x.shape[0]), np.ones(test_x.shape[0])
    with extra_imports("dphypo", "ray_dptune.search.gp"):
        import gpytorch
        import torch
        from botorch.models import SingleTaskGP
        from gpytorch.kernels import MaternKernel, RBFKernel
        from gpytorch.means import ZeroMean

    with single_thread(torch):
        x = torch.as_tensor(np.asarray(train_x, dtype=float), dtype=torch.float64)
        y = torch.as_tensor(np.asarray(train_y, dtype=float), dtype=torch.float64).reshape(-1, 1)
        covar = {"rbf": RBFKernel, "matern52": lambda: MaternKernel(nu=2.5)}[kernel]()
        covar = covar.to(torch.float64)
        covar.lengthscale = float(lengthscale)
        model = SingleTaskGP(
            x,
            y,
            train_Yvar=torch.full_like(y, float(noise_variance)),
            covar_module=covar,
            mean_module=ZeroMean(),
            outcome_transform=None,
            input_transform=None,
        )
        model.requires_grad_(False)
        model.eval()
        exact = gpytorch.settings.fast_computations(covar_root_decomposition=False, log_prob=False, solves=False)
        with torch.no_grad(), exact, gpytorch.settings.max_cholesky_size(10**9), gpytorch.settings.fast_pred_var(False):
            posterior = model.posterior(torch.as_tensor(test_x, dtype=torch.float64).unsqueeze(-2))  # n × (q = 1)
            mean = posterior.mean.reshape(-1).numpy().astype(float)
            var = posterior.variance.reshape(-1).numpy().astype(float)
    return mean, np.sqrt(np.clip(var, 0.0, None))
