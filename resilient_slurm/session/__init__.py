"""The resilience layer of one rank, for any training loop: the built-in trainer's and a user's own.

Modules, from the session outwards:
    session      the Session: agreed stop, saves, resume, ledger, metrics, tracker
    distributed  process group, rank information and the few collectives the loop uses
    heartbeat    the rank's beats to the monitor outside the training processes (UDP)
    watchdog     a thread that catches a hung step and dumps every rank's stacks
    rejoin       a survivor of a peer's death waits for the driver's word and goes on in its process
    replay       after a restart, each recomputed step's loss against its value before the failure;
                 a difference sets the copy aside and falls back (monitor/replay.py decides)
    logs         each rank's log file, and rank 0's stdout
"""
