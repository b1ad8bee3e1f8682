"""Adapters to Slurm: its environment, its commands, and the pure reading of what srun says.

Standard library only, and imports nothing at import time: `tools/xid_scan` drains a node through
`scontrol` from a bare Prolog. What watches and restarts ranks lives in `supervise/`.

Modules:
    env           SlurmEnv from the task's environment, hostlists, the rendezvous port     [pure]
    scontrol      requeue, ExcNodeList, drain, node addresses and states: the only caller of
                  scontrol
    sbatch        the only caller of sbatch: the run's own side jobs (benchmark evaluations,
                  spare top-ups)
    topup         spare nodes a running job asks for in a job of their own (cluster.spare_topup):
                  its batch script and Slurm's answers [pure], submitted, looked at, cancelled
    srun          a driven step's srun command line; srun's reports on its tasks            [pure]
    step_end      how a driven step ended: exit code, stop signal, error, lost tasks        [pure]
    placement     after a node fails: a spare, a shrink or a requeue; a node's return to
                  service; growing back                                                    [pure]
    task          a one-line re-export of `supervise.task`, and
    driver        of `supervise.driver`: Slurm jobs queued before the move hold pickles naming them
"""
