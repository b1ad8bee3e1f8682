"""One rank of a run, whoever trains: the built-in trainer or a user's `entry=` function. Knows nothing
of Hydra or submitit; the Slurm side (`supervise.task`) and the local launcher both call `rank.run`.

Modules:
    rank         one rank's life: the built-in trainer or a user's entry=, with its exit status
    entry        a user's own training function (entry=MODULE:FN), run as a rank
"""
