"""Moved to `supervise/driver.py`; kept because Slurm jobs queued before the move hold pickles naming it."""
from resilient_slurm.supervise.driver import SlurmDriver  # noqa: F401
