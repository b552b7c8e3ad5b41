"""Multiparty (threshold, N-out-of-N) CKKS on OpenFHE: the crypto math of fednorm.

Synchronous, no I/O. Protocols call these functions and move the results as messages.
Every collective operation is one class of :mod:`.multiparty` with the same verbs — a
party *generates a share* from its :class:`PartyKeys`, the server *aggregates shares*
and *finalizes* — and :class:`KeySetup` composes the key operations; :mod:`.local` runs
all roles in one process.

Levels: :func:`ensure_levels` refreshes in time; :func:`inverse` computes 1/x and
:func:`maximum` / :func:`minimum` / :func:`fold_maximum` compare (:mod:`.compare`), both
with collective bootstraps through a ``refresh`` callback; bytes: ``CkksContext.to_bytes`` /
``from_bytes`` and ``register_codec_types``.
"""

from fednorm.engine.ckks.compare import (
    ComparePlan,
    comparison_error,
    fold_maximum,
    fold_rotations,
    max_and_min,
    maximum,
    minimum,
    plan_compare,
    rotate_by,
    rotation_plan,
    tree_maximum,
)
from fednorm.engine.ckks.context import (
    COEFFICIENT_TOWERS,
    MAX_SUM_VALUE,
    CkksContext,
    sum_rotation_indices,
)
from fednorm.engine.ckks.cores import ensure_levels
from fednorm.engine.ckks.crs import bootstrap_seed, common_element
from fednorm.engine.ckks.flooding import (
    CoefficientFlooding,
    DecryptionNoise,
    Flooding,
    MeasuredFlooding,
    ProductFlooding,
    check_decryptions,
    check_security_bits,
)
from fednorm.engine.ckks.inversion import COUNT_RANGE, InversePlan, inverse, plan_inverse
from fednorm.engine.ckks.keys import (
    DECRYPT_SHARE_TOWERS,
    HeldKeys,
    JointKeys,
    PartyKeys,
    joint_tag_for,
)
from fednorm.engine.ckks.levels import (
    LevelArithmetic,
    LevelBudgetError,
    Levels,
    Refresher,
    consumed_levels,
    levels_left,
)
from fednorm.engine.ckks.local import (
    LocalRefresh,
    bootstrap_locally,
    decrypt_locally,
    local_refresh,
    setup_locally,
)
from fednorm.engine.ckks.masking import (
    coefficient_capacity,
    encrypt_coefficients,
    encrypt_masked,
    zero_bits,
)
from fednorm.engine.ckks.multiparty import (
    BootRound,
    Bootstrap,
    BootstrapShare,
    CoefficientSumDecryption,
    DecodeOverflow,
    Decryption,
    DecryptionShare,
    FloodedDecryption,
    JointRoundOne,
    KeyCheck,
    KeyDigests,
    KeySetup,
    KeyShares,
    LeadKeys,
    ProductDecryption,
    PublicKeyAggregate,
    PublicKeyGen,
    PublicKeyShare,
    RelinKeyGen,
    RelinRound2,
    RelinShare,
    RotationKeyGen,
    RotationShare,
    SetupShares,
    SumDecryption,
)
from fednorm.engine.ckks.presets import PAPER, PRESETS, TEST, CkksPreset, get_preset
from fednorm.engine.ckks.serial import KINDS, object_digest, wire_digest, wire_digests
from fednorm.engine.inprocess import in_process_run

__all__ = [
    "COEFFICIENT_TOWERS",
    "COUNT_RANGE",
    "DECRYPT_SHARE_TOWERS",
    "KINDS",
    "MAX_SUM_VALUE",
    "PAPER",
    "PRESETS",
    "TEST",
    "BootRound",
    "Bootstrap",
    "BootstrapShare",
    "CkksContext",
    "CkksPreset",
    "CoefficientFlooding",
    "CoefficientSumDecryption",
    "ComparePlan",
    "DecodeOverflow",
    "Decryption",
    "DecryptionNoise",
    "DecryptionShare",
    "FloodedDecryption",
    "Flooding",
    "HeldKeys",
    "InversePlan",
    "JointKeys",
    "JointRoundOne",
    "KeyCheck",
    "KeyDigests",
    "KeySetup",
    "KeyShares",
    "LeadKeys",
    "LevelArithmetic",
    "LevelBudgetError",
    "Levels",
    "LocalRefresh",
    "MeasuredFlooding",
    "PartyKeys",
    "ProductDecryption",
    "ProductFlooding",
    "PublicKeyAggregate",
    "PublicKeyGen",
    "PublicKeyShare",
    "Refresher",
    "RelinKeyGen",
    "RelinRound2",
    "RelinShare",
    "RotationKeyGen",
    "RotationShare",
    "SetupShares",
    "SumDecryption",
    "bootstrap_locally",
    "bootstrap_seed",
    "check_decryptions",
    "check_security_bits",
    "coefficient_capacity",
    "common_element",
    "comparison_error",
    "consumed_levels",
    "decrypt_locally",
    "encrypt_coefficients",
    "encrypt_masked",
    "ensure_levels",
    "fold_maximum",
    "fold_rotations",
    "get_preset",
    "in_process_run",
    "inverse",
    "joint_tag_for",
    "levels_left",
    "local_refresh",
    "max_and_min",
    "maximum",
    "minimum",
    "object_digest",
    "plan_compare",
    "plan_inverse",
    "rotate_by",
    "rotation_plan",
    "setup_locally",
    "sum_rotation_indices",
    "tree_maximum",
    "wire_digest",
    "wire_digests",
    "zero_bits",
]
