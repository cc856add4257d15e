"""Parallel launching of a Hydra multirun on one machine, one GPU per worker process.

``gpus`` counts the visible GPUs without initialising CUDA and plans the workers; ``pool`` runs
jobs in spawned worker processes that each keep one device for their whole life; ``hydra_jobs``
is the Hydra side (the ``mice_exp_gpu`` launcher in ``hydra_plugins/mice_exp_launcher`` calls it).
Nothing here imports torch.
"""
