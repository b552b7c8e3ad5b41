"""PPF protocols: normalization statistics pooled over multiparty CKKS.

Every statistic is pooled under a joint key and only the declared aggregates are
decrypted (docs/LEAKAGE.md).  Each method has two kinds (``FitOptions.algorithm``): the
default, whose every decryption is a flooded sum of the parties' signed uploads or an
exact bit, and the paper's algorithms.  Importing this package registers the ``mhe``
roles.
"""

from dataclasses import replace

import numpy as np

from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import FitOptions, by_algorithm, register
from fednorm.protocols.normalizers import Normalizer
from fednorm.protocols.ppf import extremes, minmax, robust, yeojohnson, zscore


async def _zscore_server(rc: RoleContext, options: FitOptions) -> Normalizer:
    return await zscore.server(rc, replace(options, reveal_counts=True))


async def _zscore_party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> Normalizer:
    return await zscore.party(rc, X, replace(options, reveal_counts=True))


register("zscore", "mhe", *by_algorithm(default=(_zscore_server, _zscore_party),
                                        paper=(zscore.server, zscore.party)))
register("minmax", "mhe", *by_algorithm(default=(extremes.server, extremes.party),
                                        paper=(minmax.server, minmax.party)))
register("robust", "mhe", *by_algorithm(default=None, paper=(robust.server, robust.party)))
register("yeojohnson", "mhe", *by_algorithm(default=None,
                                            paper=(yeojohnson.server, yeojohnson.party)))
