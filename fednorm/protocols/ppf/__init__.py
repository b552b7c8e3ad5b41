"""PPF protocols: the paper's privacy-preserving algorithms over multiparty CKKS.

Every statistic is pooled under a joint key and only the declared aggregates are
decrypted (docs/LEAKAGE.md).  Importing this package registers the ``mhe`` roles.
"""

from fednorm.protocols.ppf import (  # noqa: F401 - registration side effect
    minmax,
    robust,
    yeojohnson,
    zscore,
)
