"""Silent data corruption on the real cluster: two HSDP replicas, one rank per node, a spare. A bit
flipped in rank 1's shard after step 30's update (`fault.sdc_step`: the one thing faked, since a
real flip needs faulty memory) is found at step 30 and pinned on rank 1; the shard is healed from
the other replica over the network, the node drained with reason `sdc` and put on the exclude list;
the step stops at that boundary with the healed state saved, the job goes on without the node on
the spare, and the run ends bit-identical to its twin that no flip touched."""

from __future__ import annotations

import pytest

from resilient_slurm.health import exclude_list
from resilient_slurm.ledger import Kind
from tests.integration.runs import assert_bit_identical, events, final_tensors, run_dir
from tests.slurm.jobs import describe, job_state, reference, submit, wait_for_end
from tests.slurm.test_in_allocation import DRIVEN, of
from tests.slurm.test_node_health import node_states
from tests.slurm.test_replica_groups_jobs import STEPS, TWIN

pytestmark = pytest.mark.slurm


def test_a_flipped_bit_is_healed_its_node_drained_and_the_run_goes_on_on_the_spare(idle_cluster, tmp_path):
    ref = reference(2, *TWIN)  # the replica test's twin: one reference run for both
    job = submit(tmp_path, "sdc", *DRIVEN, "cluster.spare_nodes=1", *TWIN, "health.drain=true",
                 "fault.sdc_step=30", "fault.sdc_rank=1", f"cluster.exclude_file={tmp_path}/exclude.json")
    rdir = run_dir(tmp_path, "sdc")
    assert wait_for_end(job, rdir, 240) == "COMPLETED", describe(job, rdir)

    ev = events(rdir)
    (sdc,) = of(ev, Kind.SDC)
    d = sdc.details
    assert sdc.step == 30 and d.ranks == [1] and d.action == "healed" and d.verified and d.decided_by == "rerun", d
    (bad,) = d.nodes
    (unhealthy,) = of(ev, Kind.NODE_UNHEALTHY)
    assert unhealthy.details.bad_node == bad and unhealthy.details.reason.startswith("sdc: ")
    state, reason = node_states(idle_cluster.state_dir)[bad]
    assert state.startswith("drain") and "sdc" in reason, (state, reason)
    assert exclude_list.load(str(tmp_path / "exclude.json"))[bad].reason.startswith("sdc: ")
    (restart,) = of(ev, Kind.RESTART_IN_ALLOCATION)
    assert restart.details.move == "spare" and restart.details.replaced == [bad]
    assert job_state(job)["Restarts"] == "0" and not of(ev, Kind.REQUEUE)
    # nothing rolled back: the healed step was saved and the next start resumed from it
    (emergency,) = [e for e in of(ev, Kind.SAVE) if e.details.reason == "emergency"]
    (resume,) = of(ev, Kind.RESUME)
    assert emergency.step == resume.step == 30
    assert_bit_identical(final_tensors(ref, STEPS), final_tensors(rdir, STEPS))
