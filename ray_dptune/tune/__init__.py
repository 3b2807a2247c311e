"""The Ray Tune integration.

The accountant callback, the guard and private ASHA schedulers, ``private_tuner`` and
``release_best``. Import the names from :mod:`ray_dptune` (``from ray_dptune import
private_tuner``); the modules here import Ray.
"""
