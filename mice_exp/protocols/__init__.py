"""Which records train an estimator and which it predicts (``conf/protocol``: one object per entry).

``protocol: {_target_: mice_exp.protocols.Holdout}`` and its siblings are built in one hop by
:func:`make_protocol`; each has one ``run(study, fs) -> Outcome``. A protocol knows nothing about
how features are made: it receives a FeatureSet and the estimators to fit (a Study).
"""

from mice_exp.protocols.base import Outcome, Protocol, make_protocol
from mice_exp.protocols.sample_efficiency import SampleEfficiency
from mice_exp.protocols.table import Holdout, Loao, TableProtocol, holdout, loao

__all__ = ["Holdout", "Loao", "Outcome", "Protocol", "SampleEfficiency", "TableProtocol", "holdout", "loao",
           "make_protocol"]
