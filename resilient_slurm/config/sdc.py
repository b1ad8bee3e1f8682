"""`monitor.sdc.*`: the silent-data-corruption sentinel (resilient_slurm/replica/). [pure]"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.config.checks import Problems


@dataclass
class SdcConfig:
    """Silent data corruption: after the optimizer step, the ranks that hold the same shard in
    different HSDP replicas (parallel.dp_replicate >= 2) compare a checksum of its bits; they must
    be equal. A difference names the culprit, heals it from a good replica over the network, takes
    its node out (the exclude list, `scontrol drain` when health.drain) and training goes on."""

    enabled: bool = True
    """Compare replicas at all (a run without replicas has nothing to compare; see rerun_every_steps)."""
    every_steps: int = 1
    """Compare every this many steps (1: every step, so a flip is found at the step it happens and
    two replicas can settle it by re-running that step's update)."""
    rerun_on_tie: bool = True
    """With exactly two replicas a majority cannot name the culprit: keep each step's state from
    before the update (a host copy of the shard's weights and optimizer state) so that a third rank
    can re-run the update of the differing tensors and break the tie. False: no copy; a difference
    between two replicas is recorded with both nodes as suspects and the run restarts from its
    newest checkpoint."""
    rerun_every_steps: int = 0
    """Without replicas: every this many steps a buddy rank (on the next node) re-runs each rank's
    update from its state before the step and compares the result bit for bit (0: off). It checks
    the update and the weights at rest around it, not the forward and backward (README)."""
    leave_node: bool = True
    """In a Slurm job, once the culprit is healed, stop the step at this boundary (every rank saves
    the healed state) so that the job restarts without its node, as a failed node health check
    does; across replica groups (cluster.replica_ft) only the culprit's group moves, to a spare, and
    the others train on. False: train on beside it; each later corruption is caught and healed the
    same way."""

    def problems(self) -> list[str]:
        p = Problems()
        p.need(self.every_steps >= 1,
               f"monitor.sdc.every_steps: {self.every_steps}; set it to 1 or more (monitor.sdc.enabled=false "
               f"turns the comparison off)")
        p.need(self.rerun_every_steps >= 0,
               f"monitor.sdc.rerun_every_steps: {self.rerun_every_steps}; set it to 0 (off) or a step interval")
        return p
