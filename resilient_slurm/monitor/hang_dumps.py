"""What a rank's hang watchdog and the supervisor beside the ranks agree on when a run hangs: the
marker the first watchdog to fire leaves in the shared logs directory, how long it waits for its
peers' stack dumps, and how long one py-spy dump may take. Apart from the watchdog so the
supervisor can read them without importing torch."""

PY_SPY_TIMEOUT_S = 30.0
HANG_MARKER = ".hang"
PEER_DUMP_GRACE_S = 3.0
"""How long the first rank to fire waits, after dumping, for its peers to dump theirs."""
