"""fednorm: federated and privacy-preserving data normalization for federated learning.

Parties of a federation fit z-score, MinMax, robust or Yeo-Johnson normalization
as if their data were pooled, without pooling it: in plaintext-federated mode, or
under multiparty CKKS homomorphic encryption.
"""

import sys

if sys.version_info[:2] != (3, 10):
    raise ImportError(
        "fednorm needs CPython 3.10: its CKKS backend (openfhe 1.6.1) ships a "
        f"3.10 extension only, and this is Python {sys.version.split()[0]}. "
        "Use `make demo` / `make test`, which build a 3.10 virtualenv."
    )

__version__ = "0.1.0"
