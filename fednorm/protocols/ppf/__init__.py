"""PPF protocols: normalization statistics pooled over multiparty CKKS.

Every statistic is pooled under a joint key and only the declared aggregates are
decrypted (docs/LEAKAGE.md).  Each method has two kinds (``FitOptions.algorithm``): the
default, whose every decryption is a flooded sum of the parties' signed uploads or an
exact bit, and the paper's algorithms.  Importing this package registers the ``mhe``
roles.
"""

from fednorm.protocols.base import Kind, register, some_decryptions_unflooded
from fednorm.protocols.ppf import (
    extremes,
    minmax,
    minmax_layout,
    moments,
    robust,
    yeojohnson,
    yeojohnson_sums,
    zscore,
)

register("zscore", "mhe",
         Kind(moments.server, moments.party, moments.setup_arguments,
              flooded_decryptions=moments.flooded_decryptions),
         Kind(zscore.server, zscore.party, zscore.setup_arguments,
              unflooded=zscore.unflooded_decryptions))
register("minmax", "mhe",
         Kind(extremes.server, extremes.party, extremes.setup_arguments,
              flooded_decryptions=extremes.flooded_decryptions),
         Kind(minmax.server, minmax.party, minmax_layout.setup_arguments, needs_vabs=True,
              unflooded=some_decryptions_unflooded))
register("robust", "mhe",
         Kind(robust.server, robust.party, robust.setup_arguments,
              flooded_decryptions=robust.flooded_decryptions),
         Kind(robust.paper_server, robust.paper_party, minmax_layout.setup_arguments,
              needs_vabs=True, unflooded=some_decryptions_unflooded))
register("yeojohnson", "mhe",
         Kind(yeojohnson_sums.server, yeojohnson_sums.party, yeojohnson_sums.setup_arguments,
              flooded_decryptions=yeojohnson_sums.flooded_decryptions),
         Kind(yeojohnson.server, yeojohnson.party, yeojohnson.setup_arguments,
              needs_vabs=True, unflooded=some_decryptions_unflooded))
