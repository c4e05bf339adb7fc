import os
import sys

# Before Ray is imported (it reads this once): progress lines of different trials and cells differ only in
# numbers and ids, which Ray's log deduplication masks, so it would fold them into "[repeated Nx]".
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from sweep.cli import main  # noqa: E402

sys.exit(main())
