"""mice_exp's Hydra launcher plugin: ``hydra/launcher=mice_exp_gpu`` (conf: gpu_pool, cpu_pool).

Hydra imports every module under the ``hydra_plugins`` namespace package at start-up, in every
Hydra app of this environment, so these modules stay light: no torch, and mice_exp itself is only
imported when a sweep is launched. There is deliberately no ``hydra_plugins/__init__.py``.
"""
