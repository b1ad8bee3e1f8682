"""Replica groups as the unit of failure (cluster.replica_ft): every HSDP replica group a process
group of its own, a quorum of the live ones before each step, the step's sums over them only, and a
lost group healed from a live one over the network.

Modules, from the plan outwards:
    plan            the groups, the deal of a missing group's micro-batches, who writes, refusals  [pure]
    engine          the one seam: quorum, cross-group sum, commit
    torchft_engine  the seam on torchft (Manager, lighthouse quorum, reconfigurable process group,
                    HTTP checkpoint transport)
    sums            what a step adds up over the groups: a few floats, the gradients (one flat buffer)
    heal            a rank's whole state as a payload for its peer, and its installation there
    lighthouse      the quorum server in a process of its own, beside the launcher or the driver

The trainer's side is `trainer/replicated.py`; the supervisors' are `supervise/local_groups.py` and
the job's driver.

The silent-data-corruption sentinel (monitor.sdc), in the order a check runs:
    fingerprint   a checksum of each parameter shard's bits (integer sums, exact on any device)
    update_rerun  the state before an update kept on the host; the update re-run from it elsewhere
    wire          tensors and a little JSON between two ranks (point-to-point, a round at a time)
    roles         which ranks hold a shard's copies, the third rank, the buddy               [pure]
    verdict       disputes, the majority, two replicas' tie, a buddy's re-run; the `sdc` event [pure]
    holder        what this rank holds that is checked: its shards, optimizer, kept state, nodes
    tie           two replicas differ: a third rank re-runs the update from the kept state
    buddy         no replicas: a buddy re-runs each rank's update every N steps
    shard_heal    a good copy's weights and optimizer state into the culprit's, over the network
    across_groups the same gather and copy across replica groups, as sums over the engine
    takeout       the `sdc` record; the culprit's node out as an Xid takes one out
    sentinel      one rank's sentinel: compare after the update, rule, heal, record
"""
