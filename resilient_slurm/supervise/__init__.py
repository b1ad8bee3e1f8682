"""What watches the ranks of a run from outside the training loop, and restarts them.

Modules, in the order a run meets them:
    local         cluster=local: the job in-process, or one process per rank, signals forwarded, a
                  dead rank's peers killed after a grace period
    local_groups  cluster=local with replica groups: each group its own process group, the lighthouse,
                  a failed group alone stopped and started anew (it heals from a live one)
    local_procs   the local launcher's plumbing: ranks that die with it, ports, signals, exit status
    heartbeat     the ranks' heartbeats received (UDP), and which ranks are silent
    hangs         a silent rank: every rank's stacks on record, a `hang` event on its node
    task          one Slurm task's life: rank setup → the training job → the recovery decision → requeue
    health_watch  the job's own node-health checks (preflight and periodic), off the loop
    driver        with spare nodes or elastic shrinking: runs training as job steps, restarts it
                  inside the allocation after a failure, requeues when it cannot, grows a shrunk
                  run back at a checkpoint onto nodes returned to service
    steps         the srun steps of one start (a generation): srun's reports as they arrive
    replica_driver  with replica groups: a job step per group, a failed group alone replaced (a
                  lost node's ranks on a spare's standby), refusals restart every group
    standby       warm processes on the spares, woken as replacements instead of new steps
    restarts      a restart inside the allocation recorded, with its breakdown part by part
"""
