"""The Slurm side: what runs in each task of a job, and the one adapter to Slurm's commands.

Imports nothing at import time; `env` and `scontrol` are standard library only, so `tools/xid_scan`
can drain a node through `scontrol` from a bare Prolog.

Modules, in the order a job uses them:
    env           SlurmEnv from the task's environment, hostlists, the rendezvous port     [pure]
    scontrol      requeue, ExcNodeList, drain, node addresses and states: the only caller of
                  scontrol
    health_watch  the job's own node-health checks (preflight and periodic), off the loop
    task          one task's life: rank setup → runtime.job → the recovery decision → requeue
    driver        with spare nodes or elastic shrinking: runs training as job steps, restarts it
                  inside the allocation after a failure, requeues when it cannot, grows a shrunk
                  run back at a checkpoint onto nodes returned to service
    srun          a driven step's srun command line; srun's reports on its tasks            [pure]
    step_end      how a driven step ended: exit code, stop signal, error, lost tasks        [pure]
    placement     after a node fails: a spare, a shrink or a requeue; a node's return to
                  service; growing back                                                    [pure]
"""
