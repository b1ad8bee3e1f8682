"""`python -m resilient_slurm.report RUN_DIR [RUN_DIR ...]` (also `resilient-report`): the run
report. It lives in `analysis/report.py`; this module keeps the command where users know it."""

import sys

from resilient_slurm.analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
