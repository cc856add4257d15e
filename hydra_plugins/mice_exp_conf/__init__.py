"""mice_exp's configs that Hydra composes from code: ``baselines: all`` of ``conf/config.yaml``
(:func:`mice_exp.compose.store_baselines`, every ``conf/estimator`` entry under ``baselines.<name>``).

Hydra imports every module under the ``hydra_plugins`` namespace package when it starts, in every process and
before it composes anything, so the store is there for whatever composes ``conf/config.yaml``: the app, its
multirun workers, :func:`mice_exp.compose.compose_config` and Hydra's own ``compose``. Light: the configs'
module, which Hydra itself has already loaded the libraries of.
"""

from mice_exp.compose import store_baselines

store_baselines()
