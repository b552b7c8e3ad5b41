"""``fednorm party ...`` that stalls at a chosen protocol phase, for the dropout test.

``FEDNORM_STALL_AT`` names the phase; the party's computation there is replaced by:
write the marker file named by ``FEDNORM_STALL_MARKER``, then sleep.  So the test can
SIGKILL the party at a known point of the protocol:

- ``plain-round2``: plain z-score, after round one, before it answers round two;
- ``mhe-setup``: the paper's PPF z-score, during collective key generation
  (relinearization round 2);
- ``mhe-decrypt``: the paper's PPF z-score, when asked for its first decryption share.
"""

import os
import sys
import time
from pathlib import Path

from fednorm.cli import main
from fednorm.engine import ckks
from fednorm.protocols.plain import zscore


def stall(*args: object, **kwargs: object) -> None:
    Path(os.environ["FEDNORM_STALL_MARKER"]).write_text("stalled")
    time.sleep(600)
    raise AssertionError("the test should have killed this party")


PHASES = {
    "plain-round2": (zscore, "deviation_sums"),
    "mhe-setup": (ckks.PartyKeys, "relin_mult_share"),
    "mhe-decrypt": (ckks.PartyKeys, "decrypt_share"),
}
owner, name = PHASES[os.environ.get("FEDNORM_STALL_AT", "plain-round2")]
setattr(owner, name, stall)
sys.exit(main(sys.argv[1:]))
