"""Plaintext protocols: parties send their local statistics in the clear to the server.

Importing this package registers the plain server and party roles of every method.
"""

from fednorm.protocols.plain import (  # noqa: F401 - registration side effect
    minmax,
    robust,
    yeojohnson,
    zscore,
)
