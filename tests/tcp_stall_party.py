"""``fednorm party ...`` that stalls inside the z-score protocol, for the dropout test.

The party's second-round computation is replaced by: write the marker file named by
``FEDNORM_STALL_MARKER``, then sleep.  So the test can SIGKILL the party at a known
point of the protocol: after round one, before it answers round two.
"""

import os
import sys
import time
from pathlib import Path

from fednorm.cli import main
from fednorm.protocols import zscore


def stall(*args: object) -> None:
    Path(os.environ["FEDNORM_STALL_MARKER"]).write_text("stalled")
    time.sleep(600)
    raise AssertionError("the test should have killed this party")


zscore.deviation_sums = stall
sys.exit(main(sys.argv[1:]))
