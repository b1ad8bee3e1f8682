"""Process exit statuses and what the launcher or Slurm should do about each."""

from enum import IntEnum


class ExitCode(IntEnum):
    """The status a run's process exits with; a user's own loop under `Session` exits with the same."""

    DONE = 0
    """Training finished; nothing to resume."""
    FAILED = 1
    """Crashed; a restart may help (counts against the restart budget)."""
    CONFIG = 2
    """Bad configuration or input; fix it and launch again."""
    GAVE_UP = 70
    """Stopped for good (a code bug, a run that keeps diverging): do not requeue; fix something first.
    70 is EX_SOFTWARE from sysexits.h."""
    RESUME = 75
    """Stopped on request after an emergency checkpoint: launch or requeue again to continue.
    75 is EX_TEMPFAIL from sysexits.h: "temporary failure, try again"."""
    INTERRUPTED = 130
    """Stopped at once by a second Ctrl-C, without a save (128 + SIGINT, as a shell reports it):
    launch again to resume from the newest checkpoint."""
