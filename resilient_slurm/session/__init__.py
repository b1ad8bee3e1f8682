"""The resilience layer of one rank, for any training loop: the built-in trainer's and a user's own.

Modules, from the session outwards:
    step_sync    what every rank agrees at the end of a step, and where the loop stands  [pure]
    step_record  a step's metrics and data position as JSON holds them; the step line   [pure]
    resume       what a loop registers (checked when registered), and the newest checkpoint loaded into it
    session      the Session: its lifecycle, the agreed stop, saves, ledger, metrics, tracker
    context      what the launcher hands a user's function's Session, and how the rank ended
    distributed  process group, rank information and the few collectives the loop uses
    replica_place  where a rank sits among the replica groups (cluster.replica_ft)           [pure]
    heartbeat    the rank's beats to the monitor outside the training processes (UDP)
    collectives  each process group's sequence number and the training thread's collective waits;
                 the flight recorder's environment and dump
    sections     the step's sections (data, forward, backward, optimizer, collective wait)
    watchdog     a thread that catches a hung step and dumps every rank's stacks
    rejoin       a survivor of a peer's death waits for the driver's word and goes on in its process
    replay       after a restart, each recomputed step's loss against its value before the failure;
                 a difference sets the copy aside and falls back (monitor/replay.py decides)
    logs         each rank's log file, and rank 0's stdout
"""
