"""PPF protocols: normalization statistics pooled over multiparty CKKS.

Every statistic is pooled under a joint key and only the declared aggregates are
decrypted (docs/LEAKAGE.md).  Each method has two kinds (``FitOptions.algorithm``): the
default, whose every decryption is a flooded sum of the parties' signed uploads or an
exact bit, and the paper's algorithms.  Importing this package registers the ``mhe``
roles.
"""

import numpy as np

from fednorm.engine.runtime import RoleContext
from fednorm.protocols.base import FitOptions, by_algorithm, register
from fednorm.protocols.normalizers import Normalizer
from fednorm.protocols.ppf import extremes, minmax, robust, yeojohnson, yeojohnson_sums, zscore


async def _zscore_server(rc: RoleContext, options: FitOptions) -> Normalizer:
    return await zscore.server(rc, zscore.revealing(options))


async def _zscore_party(rc: RoleContext, X: np.ndarray, options: FitOptions) -> Normalizer:
    return await zscore.party(rc, X, zscore.revealing(options))


register("zscore", "mhe", *by_algorithm(default=(_zscore_server, _zscore_party),
                                        paper=(zscore.server, zscore.party)))
register("minmax", "mhe", *by_algorithm(default=(extremes.server, extremes.party),
                                        paper=(minmax.server, minmax.party)))
register("robust", "mhe", *by_algorithm(default=(robust.server, robust.party),
                                        paper=(robust.paper_server, robust.paper_party)))
register("yeojohnson", "mhe", *by_algorithm(
    default=(yeojohnson_sums.server, yeojohnson_sums.party),
    paper=(yeojohnson.server, yeojohnson.party)))
