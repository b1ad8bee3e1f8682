"""Moved to `supervise/task.py`; kept because Slurm jobs queued before the move hold pickles naming it."""
from resilient_slurm.supervise.task import SlurmTask  # noqa: F401
