import os
import sys

# Before Ray is imported (it reads this once): progress lines of different trials and cells differ only in
# numbers and ids, which Ray's log deduplication masks, so it would fold them into "[repeated Nx]".
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Tune's legacy console output, which at verbose=0 prints nothing: the new one prints a configuration box and
# a TensorBoard command into Ray's session folder (none of our trials' events) even then. The sweep shows
# its own progress (sweep.progress) and the right `tensorboard --logdir`.
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

from sweep.cli import main  # noqa: E402

sys.exit(main())
