"""What watches the ranks of a run from outside the training loop, and restarts them.

Modules, in the order a run meets them:
    local         cluster=local: the job in-process, or one process per rank, signals forwarded, a
                  dead rank's peers killed after a grace period
    local_groups  cluster=local with replica groups: each group its own process group, the lighthouse,
                  a failed group alone stopped and started anew (it heals from a live one)
    local_procs   the local launcher's plumbing: ranks that die with it, ports, signals, exit status
    heartbeat     the ranks' heartbeats received (UDP): which ranks are hung, whom the others wait
                  for, which rank is a straggler
    hangs         hung ranks: every rank's stacks on record, a `hang` event naming the culprits
    stragglers    a straggler: its `straggler` event and its node's mark in the node record
    task          one Slurm task's life: rank setup → the training job → the recovery decision → requeue
    health_watch  the job's own node-health checks (preflight and periodic), off the loop
    conclusion    what the driver concludes when a start ended: Finished | RestartHere | Requeue |
                  LeaveToSlurm | GiveUp                                                    [pure]
    job           the job a driver runs in: ids, config, ledger context, srun command lines
    driver        with spare nodes or elastic shrinking: runs training as job steps, restarts it
                  inside the allocation after a failure, requeues when it cannot, grows a shrunk
                  run back and swaps a straggler out at a checkpoint; `act` acts on the conclusion
    inprocess     a restart inside the surviving processes: replacements started, survivors told
    steps         the srun steps of one start (a generation): srun's reports as they arrive
    replica_driver  with replica groups: a job step per group, a failed group alone replaced (a
                  lost node's ranks on a spare's standby), refusals restart every group
    standby       warm processes on the spares, woken as replacements instead of new steps
    restarts      a restart inside the allocation recorded, with its breakdown part by part
"""
