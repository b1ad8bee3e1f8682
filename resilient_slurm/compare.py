"""`python -m resilient_slurm.compare RUN_A RUN_B` (also `resilient-compare`): what differs between
two runs. It lives in `analysis/compare.py`; this module keeps the command where users know it."""

import sys

from resilient_slurm.analysis.compare import main

if __name__ == "__main__":
    sys.exit(main())
