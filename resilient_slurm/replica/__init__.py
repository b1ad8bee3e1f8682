"""Replicas as the unit of failure: the silent-data-corruption sentinel (monitor.sdc).

Modules, in the order a check runs:
    fingerprint   a checksum of each parameter shard's bits (integer sums, exact on any device)
    update_rerun  the state before an update kept on the host; the update re-run from it elsewhere
    wire          tensors and a little JSON between two ranks (point-to-point, a round at a time)
    roles         which ranks hold a shard's copies, the third rank, the buddy               [pure]
    verdict       disputes, the majority, two replicas' tie, a buddy's re-run; the `sdc` event [pure]
    holder        what this rank holds that is checked: its shards, optimizer, kept state, nodes
    tie           two replicas differ: a third rank re-runs the update from the kept state
    buddy         no replicas: a buddy re-runs each rank's update every N steps
    shard_heal    a good copy's weights and optimizer state into the culprit's, over the network
    takeout       the `sdc` record; the culprit's node out as an Xid takes one out
    sentinel      one rank's sentinel: compare after the update, rule, heal, record
"""
