"""The protocol options ``fednorm simulate``, ``serve`` and ``experiment`` take, parsed once.

The server of a multi-host run sends its options to the parties in the welcome, so the
parties check their data against the same V_abs and search with the same ε.
"""

from __future__ import annotations

import argparse

from fednorm.engine.ckks.flooding import DEFAULT_DECRYPTIONS
from fednorm.engine.errors import InputError
from fednorm.protocols import FitOptions


def add_fit_options(parser: argparse.ArgumentParser, preset_flag: str = "--preset",
                    vabs_default: str = "") -> None:
    """``preset_flag`` names the CKKS preset option (``experiment`` has its own
    ``--preset``); ``vabs_default`` is added to the V_abs help."""
    parser.add_argument(preset_flag, dest="ckks_preset", choices=("test", "paper"),
                        default="paper", help="CKKS parameters for --privacy mhe")
    parser.add_argument("--algorithm", choices=("default", "paper"), default="default",
                        help="mhe: 'default' protocols decrypt only flooded sums and exact "
                             "bits (no V_abs, no bootstraps); 'paper' runs the paper's "
                             "algorithms (default: %(default)s)")
    parser.add_argument("--reveal-counts", action="store_true",
                        help="mhe --algorithm paper: decrypt the pooled counts instead of "
                             "inverting them encrypted (the default algorithm always does)")
    parser.add_argument("--epsilon", type=float, help="absolute precision of quantile search")
    parser.add_argument("--rank-probes", type=int, metavar="K",
                        help="robust: points probed per quartile and round; K reveals K counts "
                             "a round and needs fewer rounds (default: 1, the paper's "
                             "bisection, plain and --algorithm paper; under mhe's default "
                             "algorithm as many as one ciphertext holds, at most 255)")
    parser.add_argument("--flooding-decryptions", type=int, default=DEFAULT_DECRYPTIONS,
                        metavar="TAU",
                        help="mhe: flooded decryptions one joint key serves at most (τ; "
                             "default %(default)s); the flooding noise grows as √τ; a run "
                             "that needs more is refused before any key, saying how many")
    parser.add_argument("--vabs", help="mhe minmax/robust/yeojohnson: agreed bound on |x|, one "
                                       "value or one per feature separated by commas"
                                       + vabs_default)


def fit_options(args: argparse.Namespace, replay: bool = True) -> FitOptions:
    """The options of ``args`` (checked as :class:`FitOptions` is made); ``replay`` is the
    party's own choice (:data:`~fednorm.protocols.base.LOCAL`)."""
    return FitOptions(algorithm=args.algorithm, epsilon=args.epsilon, preset=args.ckks_preset,
                      rank_probes=args.rank_probes, reveal_counts=args.reveal_counts,
                      vabs=parse_vabs(args.vabs),
                      flooding_decryptions=args.flooding_decryptions, replay=replay)


def parse_vabs(text: str | None) -> tuple[float, ...] | None:
    """``--vabs 1000`` (all features) or ``--vabs 10,2.5,1e6`` (one per feature)."""
    if text is None:
        return None
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"--vabs takes numbers separated by commas, not {text!r}") from None
