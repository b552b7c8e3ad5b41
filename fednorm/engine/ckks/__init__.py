"""Multiparty (threshold, N-out-of-N) CKKS on OpenFHE: the crypto math of fednorm.

Synchronous, no I/O. Protocols call these functions and move the results as messages:
a party makes a *share* (:class:`PartyKeys` methods), the server *aggregates* and
*finalizes* (:mod:`.collective`); :mod:`.local` runs all roles in one process.

=====================  ==========================  ===============================
operation              party (share)               server (aggregate -> finalize)
=====================  ==========================  ===============================
joint public key       PartyKeys.generate          aggregate_public_key -> JointKeys
relinearization key    relin_share,                aggregate_relin_round1,
                       relin_mult_share            aggregate_relin_round2 ->
                                                   CkksContext.install_relin_key
rotation keys          rotation_share              aggregate_rotation_shares ->
                                                   CkksContext.install_rotation_keys
decryption             decrypt_share               aggregate_decrypt_shares ->
                                                   CkksContext.decode
bootstrapping          boot_share                  start_bootstrap, aggregate_boot_shares
                                                   -> finish_bootstrap
=====================  ==========================  ===============================

Levels: :func:`ensure_levels` refreshes in time; :func:`inverse` computes 1/x and
:func:`maximum` / :func:`minimum` / :func:`fold_maximum` compare (:mod:`.compare`), both
with collective bootstraps through a ``refresh`` callback; bytes: ``CkksContext.to_bytes`` /
``from_bytes`` and ``register_codec_types``.
"""

from fednorm.engine.ckks.collective import (
    BootRound,
    DecodeOverflow,
    aggregate_boot_shares,
    aggregate_decrypt_shares,
    aggregate_public_key,
    aggregate_relin_round1,
    aggregate_relin_round2,
    aggregate_rotation_shares,
    finish_bootstrap,
    fuse_decryption,
    fuse_sum_decryption,
    start_bootstrap,
)
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
from fednorm.engine.ckks.context import MAX_SUM_VALUE, CkksContext, sum_rotation_indices
from fednorm.engine.ckks.crs import bootstrap_seed, common_element
from fednorm.engine.ckks.flooding import Flooding, check_security_bits
from fednorm.engine.ckks.inversion import COUNT_RANGE, InversePlan, inverse, plan_inverse
from fednorm.engine.ckks.keys import DECRYPT_SHARE_TOWERS, JointKeys, PartyKeys, joint_tag_for
from fednorm.engine.ckks.levels import (
    LevelBudgetError,
    Refresh,
    consumed_levels,
    ensure_levels,
    levels_left,
)
from fednorm.engine.ckks.local import (
    LocalRefresh,
    bootstrap_locally,
    decrypt_locally,
    local_refresh,
    setup_locally,
)
from fednorm.engine.ckks.presets import PAPER, PRESETS, TEST, CkksPreset, get_preset
from fednorm.engine.ckks.serial import KINDS

__all__ = [
    "COUNT_RANGE",
    "DECRYPT_SHARE_TOWERS",
    "KINDS",
    "MAX_SUM_VALUE",
    "PAPER",
    "PRESETS",
    "TEST",
    "BootRound",
    "CkksContext",
    "CkksPreset",
    "ComparePlan",
    "DecodeOverflow",
    "Flooding",
    "InversePlan",
    "JointKeys",
    "LevelBudgetError",
    "LocalRefresh",
    "PartyKeys",
    "Refresh",
    "aggregate_boot_shares",
    "aggregate_decrypt_shares",
    "aggregate_public_key",
    "aggregate_relin_round1",
    "aggregate_relin_round2",
    "aggregate_rotation_shares",
    "bootstrap_locally",
    "bootstrap_seed",
    "check_security_bits",
    "common_element",
    "comparison_error",
    "consumed_levels",
    "decrypt_locally",
    "ensure_levels",
    "finish_bootstrap",
    "fold_maximum",
    "fold_rotations",
    "fuse_decryption",
    "fuse_sum_decryption",
    "get_preset",
    "inverse",
    "joint_tag_for",
    "levels_left",
    "local_refresh",
    "max_and_min",
    "maximum",
    "minimum",
    "plan_compare",
    "plan_inverse",
    "rotate_by",
    "rotation_plan",
    "setup_locally",
    "start_bootstrap",
    "sum_rotation_indices",
    "tree_maximum",
]
