"""Replica groups as the unit of failure (cluster.replica_ft): every HSDP replica group a process
group of its own, a quorum of the live ones before each step, the step's sums over them only, and a
lost group healed from a live one over the network.

Modules, from the plan outwards:
    plan            the groups, the deal of a missing group's micro-batches, who writes, refusals  [pure]
    engine          the one seam: quorum, cross-group sum, commit; gather and heal for the SDC sentinel
    torchft_engine  the seam on torchft (Manager, lighthouse quorum, reconfigurable process group,
                    HTTP checkpoint transport)
    sums            what a step adds up over the groups: a few floats, the gradients (one flat buffer)
    heal            a rank's whole state as a payload for its peer, and its installation there
    lighthouse      the quorum server in a process of its own, beside the launcher or the driver

The trainer's side is `trainer/replicated.py`; the supervisors' are `supervise/local_groups.py` and
the job's driver.
"""
